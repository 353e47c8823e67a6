//! A scenario played N times (a stress script sets N through an environment variable), summed up in one
//! table row that the script collects: runs, unexpected outcomes, the documented result, median and worst
//! time.

use std::time::Duration;

/// How many times to play each scenario: `var` (a positive integer), else once.
pub fn runs(var: &str) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(1)
}

/// Plays `scenario` `runs(var)` times; each run returns its time to the decisive event. Prints one
/// `TAG | name | runs | unexpected | expected | median | worst` row, then fails if any run ended otherwise.
pub fn play(tag: &str, var: &str, name: &str, expected: &str, scenario: impl Fn() -> Duration + std::panic::RefUnwindSafe) {
    let n = runs(var);
    let (mut times, mut unexpected) = (Vec::new(), Vec::new());
    for run in 0..n {
        match std::panic::catch_unwind(&scenario) {
            Ok(t) => times.push(t),
            Err(e) => {
                let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                unexpected.push(format!("run {run}: {}", msg.unwrap_or_default()));
            }
        }
    }
    times.sort();
    let ms = |t: Option<&Duration>| t.map(|t| format!("{} ms", t.as_millis())).unwrap_or_else(|| "-".into());
    let (median, worst) = (ms(times.get(times.len() / 2)), ms(times.last()));
    println!("{tag} | {name} | {n} | {} | {expected} | {median} | {worst}", unexpected.len());
    assert!(unexpected.is_empty(), "{name}: {} of {n} runs unexpected:\n{}", unexpected.len(), unexpected.join("\n"));
}
