//! Where the agent's wall time goes: training, or lost in one phase. Every transition adds the time spent
//! in the state it leaves to one bucket, so the buckets tile the agent's life from its start to its end:
//! their sum is its wall time.
//!
//! - `rendezvous`: set-up from the agent's start (a wait for a store that does not answer included), the
//!   first join, every re-formation and re-join;
//! - `spawn`: placing and starting the workers;
//! - `warmup`: from the workers' start to their first progress mark (the script's imports,
//!   `init_process_group`, a checkpoint load, the first step). Measured where progress is (hang detection
//!   on: a line matching `--progress-pattern`, a touch of `$MUSTER_PROGRESS_FILE`, a file-timer request);
//!   without it the warm-up counts as training. Workers that never showed progress spent it all warming up;
//! - `reform`: a start that kept workers in place, from their hand-over to the moment every one of them said
//!   it re-formed (the new process group joined, the state received; the workers started beside them
//!   reaching it included). Such a start's warm-up is its re-formation: it is counted here, not in
//!   `warmup`. A re-formation that never ended lost the whole run;
//! - `detect`: from the event that stopped the workers reaching the agent to the stop beginning;
//! - `stop`: stopping the workers (the grace a checkpoint may use);
//! - `finish`: the exit barrier and closing, or draining the node;
//! - training (`productive`): the rest of the time the workers ran.
//!
//! Steps a restored checkpoint makes the workers redo look like training from here; the benchmark
//! (`scripts/bench/goodput.sh`) counts them from the steps' own log.

use std::time::Duration;

use super::record::PhaseKind;

/// The lost-time buckets, as `muster_lost_seconds_total{phase}` and the goodput event name them.
pub const LOST: [&str; 7] = ["rendezvous", "spawn", "warmup", "reform", "detect", "stop", "finish"];

const RENDEZVOUS: usize = 0;
const SPAWN: usize = 1;
const WARMUP: usize = 2;
const REFORM: usize = 3;
const DETECT: usize = 4;
const STOP: usize = 5;
const FINISH: usize = 6;

/// The agent's time so far: lost by phase ([`LOST`] order) and training.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Goodput {
    pub lost: [Duration; 7],
    pub productive: Duration,
}

/// What one transition added.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Added {
    pub lost: [Duration; 7],
    pub productive: Duration,
}

/// How the end of a run's warm-up (its first progress, or its re-formation in place) is known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Warmup {
    /// No progress source: the whole run counts as training.
    NotMeasured,
    /// The first mark came this long after the workers started.
    Until(Duration),
    /// Progress is watched and none came.
    NoProgress,
    /// Workers were kept in place: they re-formed this long after the start (None: never).
    Reformed(Option<Duration>),
}

impl Goodput {
    /// The time `spent` in `from` ends now. Leaving a run of the workers (`running`): `detect` is how long
    /// before now the input that ends it arrived (zero unless it stops them), `warmup` their first mark.
    pub fn add(&mut self, from: PhaseKind, spent: Duration, detect: Duration, warmup: Warmup) -> Added {
        let mut added = Added::default();
        match from {
            PhaseKind::Init | PhaseKind::Rendezvous | PhaseKind::Restarting => added.lost[RENDEZVOUS] = spent,
            PhaseKind::Starting => added.lost[SPAWN] = spent,
            PhaseKind::Stopping => added.lost[STOP] = spent,
            PhaseKind::Finishing | PhaseKind::Draining => added.lost[FINISH] = spent,
            PhaseKind::Running => {
                let detect = detect.min(spent);
                let (bucket, warm) = match warmup {
                    Warmup::NotMeasured => (WARMUP, Duration::ZERO),
                    Warmup::Until(d) => (WARMUP, d),
                    Warmup::NoProgress => (WARMUP, spent),
                    Warmup::Reformed(d) => (REFORM, d.unwrap_or(spent)),
                };
                let warm = warm.min(spent - detect);
                added.lost[DETECT] = detect;
                added.lost[bucket] = warm;
                added.productive = spent - detect - warm;
            }
            PhaseKind::Succeeded | PhaseKind::Failed | PhaseKind::Interrupted | PhaseKind::Drained => {}
        }
        for (total, more) in self.lost.iter_mut().zip(added.lost) {
            *total += more;
        }
        self.productive += added.productive;
        added
    }

    pub fn wall(&self) -> Duration {
        self.lost.iter().sum::<Duration>() + self.productive
    }

    /// The share of the wall time spent training (0 before any time passed).
    pub fn ratio(&self) -> f64 {
        let wall = self.wall().as_secs_f64();
        if wall > 0.0 {
            self.productive.as_secs_f64() / wall
        } else {
            0.0
        }
    }

    /// The end-of-run line: `goodput 83.2% of 60.1 s: training 50.0 s; lost rendezvous 1.2 s, ...`.
    pub fn line(&self) -> String {
        let lost: Vec<String> = LOST.iter().zip(self.lost).map(|(name, d)| format!("{name} {:.1} s", d.as_secs_f64())).collect();
        format!(
            "goodput {:.1}% of {:.1} s: training {:.1} s; lost {}",
            self.ratio() * 100.0,
            self.wall().as_secs_f64(),
            self.productive.as_secs_f64(),
            lost.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn every_state_s_time_goes_to_one_bucket_and_the_buckets_tile_the_wall_time() {
        use PhaseKind::*;
        // (from, spent ms, detect ms, warm-up) → (bucket, ms) added besides training, training ms
        type Row = (PhaseKind, u64, u64, Warmup, Option<(&'static str, u64)>, u64);
        let table: &[Row] = &[
            (Init, 3, 0, Warmup::NotMeasured, Some(("rendezvous", 3)), 0),
            (Rendezvous, 40, 0, Warmup::NotMeasured, Some(("rendezvous", 40)), 0),
            (Starting, 20, 0, Warmup::NotMeasured, Some(("spawn", 20)), 0),
            (Running, 1000, 0, Warmup::NotMeasured, None, 1000),
            (Stopping, 30, 0, Warmup::NotMeasured, Some(("stop", 30)), 0),
            (Restarting, 2, 0, Warmup::NotMeasured, Some(("rendezvous", 2)), 0),
            (Finishing, 5, 0, Warmup::NotMeasured, Some(("finish", 5)), 0),
            (Draining, 7, 0, Warmup::NotMeasured, Some(("finish", 7)), 0),
            (Failed, 9, 0, Warmup::NotMeasured, None, 0),
        ];
        let mut g = Goodput::default();
        let mut wall = Duration::ZERO;
        for (from, spent, detect, warmup, bucket, training) in table {
            let added = g.add(*from, ms(*spent), ms(*detect), *warmup);
            let mut expected = Added { productive: ms(*training), ..Added::default() };
            if let Some((name, n)) = bucket {
                let i = LOST.iter().position(|l| l == name).unwrap();
                expected.lost[i] = ms(*n);
            }
            assert_eq!(added, expected, "{from:?}");
            if !matches!(from, Failed) {
                wall += ms(*spent);
            }
        }
        assert_eq!(g.wall(), wall);
        assert_eq!(g.productive, ms(1000));
    }

    #[test]
    fn a_run_splits_into_warm_up_training_and_detection() {
        let mut g = Goodput::default();
        let run = |g: &mut Goodput, detect, warmup| g.add(PhaseKind::Running, ms(1000), ms(detect), warmup);
        // (detect, warm-up) → (warm-up, detect, training)
        let table: &[(u64, Warmup, (u64, u64, u64))] = &[
            (50, Warmup::Until(ms(300)), (300, 50, 650)),
            (0, Warmup::Until(ms(300)), (300, 0, 700)),
            (50, Warmup::NotMeasured, (0, 50, 950)),
            (50, Warmup::NoProgress, (950, 50, 0)),
            // The fault came during the warm-up: what is left before it was warm-up.
            (900, Warmup::Until(ms(300)), (100, 900, 0)),
            // An input older than the run: all of the run was detection.
            (5000, Warmup::Until(ms(300)), (0, 1000, 0)),
        ];
        for (detect, warmup, (warm, det, training)) in table {
            let a = run(&mut g, *detect, *warmup);
            assert_eq!((a.lost[WARMUP], a.lost[DETECT], a.productive), (ms(*warm), ms(*det), ms(*training)), "{detect} {warmup:?}");
        }
        assert_eq!(g.wall(), ms(6000));
    }

    #[test]
    fn a_run_that_kept_workers_in_place_loses_its_re_formation() {
        let mut g = Goodput::default();
        // (detect, re-formed after) → (reform, detect, training); never any warm-up.
        type Row = (u64, Option<u64>, (u64, u64, u64));
        let table: &[Row] = &[
            (0, Some(400), (400, 0, 600)),
            (50, Some(400), (400, 50, 550)),
            // Stopped before the re-formation ended: lost all but the detection.
            (100, None, (900, 100, 0)),
            (950, Some(400), (50, 950, 0)),
        ];
        for (detect, reformed, (reform, det, training)) in table {
            let a = g.add(PhaseKind::Running, ms(1000), ms(*detect), Warmup::Reformed(reformed.map(ms)));
            let got = (a.lost[REFORM], a.lost[DETECT], a.productive, a.lost[WARMUP]);
            assert_eq!(got, (ms(*reform), ms(*det), ms(*training), Duration::ZERO), "{detect} {reformed:?}");
        }
        assert_eq!(g.wall(), ms(4000));
    }

    #[test]
    fn the_line_says_the_share_and_every_bucket() {
        let mut g = Goodput::default();
        g.add(PhaseKind::Rendezvous, ms(1000), ms(0), Warmup::NotMeasured);
        g.add(PhaseKind::Running, ms(3000), ms(0), Warmup::NotMeasured);
        assert_eq!(g.ratio(), 0.75);
        let line = g.line();
        assert!(line.starts_with("goodput 75.0% of 4.0 s: training 3.0 s; lost rendezvous 1.0 s, spawn 0.0 s"), "{line}");
        assert!(LOST.iter().all(|l| line.contains(l)), "{line}");
    }
}
