//! Every message muster can print to a user is in `docs/errors.md`, with its cause and fix.
//!
//! The test reads `src/**/*.rs` (test code left out) and collects the message literals: `#[error("...")]`,
//! `eprintln!`, `errln!` (muster's own, `console.rs`), `bail!`, `anyhow!`, `warn!` and `error!`, the config's
//! `bad(...)`, the text given to an error variant (`SomeError::Variant("..."` or `(format!("..."`) and
//! `reason: "..."`. Each must appear on one line of the catalogue: its `{...}` placeholders match anything,
//! its literal pieces must be there in order.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A string literal, escapes and `\`-newline continuations resolved; byte strings are not messages.
    Str { text: String, bytes: bool },
    Word(String),
    Punct(char),
}

/// Rust tokens enough to find string literals: comments skipped, raw and byte strings, char literals
/// told apart from lifetimes. Each token comes with its line.
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < c.len() {
        let start_line = line;
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if let Some((text, bytes, next)) = string_at(&c, i) {
            line += c[i..next].iter().filter(|x| **x == '\n').count();
            out.push((Tok::Str { text, bytes }, start_line));
            i = next;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let s = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Word(c[s..i].iter().collect()), start_line));
        } else {
            out.push((Tok::Punct(ch), start_line));
            i += 1;
        }
    }
    out
}

/// The string literal starting at `i` (`"..."`, `r#"..."#`, `b"..."`, `br"..."`): its text, whether it
/// is a byte string, and the index after it.
fn string_at(c: &[char], i: usize) -> Option<(String, bool, usize)> {
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    // A prefix is only a prefix at the start of a token.
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    let bytes = at(j) == 'b';
    if bytes || at(j) == 'c' {
        j += 1;
    }
    if at(j) == 'r' && (at(j + 1) == '"' || at(j + 1) == '#') {
        j += 1;
        let hashes = c[j..].iter().take_while(|x| **x == '#').count();
        j += hashes;
        if at(j) != '"' {
            return None;
        }
        let body = j + 1;
        let mut k = body;
        while k < c.len() {
            if c[k] == '"' && c[k + 1..].iter().take(hashes).filter(|x| **x == '#').count() == hashes {
                return Some((c[body..k].iter().collect(), bytes, k + 1 + hashes));
            }
            k += 1;
        }
        return None;
    }
    if at(j) != '"' {
        return None;
    }
    let mut k = j + 1;
    let mut text = String::new();
    while k < c.len() && c[k] != '"' {
        if c[k] == '\\' {
            k += 1;
            match at(k) {
                'n' => text.push('\n'),
                't' => text.push('\t'),
                'r' => text.push('\r'),
                '0' => text.push('\0'),
                'x' => {
                    let hex: String = c[k + 1..k + 3].iter().collect();
                    text.push(u8::from_str_radix(&hex, 16).map(char::from).unwrap_or('?'));
                    k += 2;
                }
                'u' => {
                    let end = k + c[k..].iter().position(|x| *x == '}').unwrap_or(0);
                    let hex: String = c[k + 2..end].iter().collect();
                    text.push(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).unwrap_or('?'));
                    k = end;
                }
                '\n' => {
                    // A continuation: the newline and the next line's leading whitespace are not in the string.
                    while c.get(k + 1).is_some_and(|x| x.is_whitespace()) {
                        k += 1;
                    }
                }
                other => text.push(other),
            }
            k += 1;
        } else {
            text.push(c[k]);
            k += 1;
        }
    }
    Some((text, bytes, k + 1))
}

/// The tokens with every `#[cfg(test)]` item (a `mod tests;`, a `mod tests { ... }`, a test helper) removed.
fn without_test_code(toks: Vec<(Tok, usize)>) -> Vec<(Tok, usize)> {
    let p = |ch: char| Tok::Punct(ch);
    let w = |s: &str| Tok::Word(s.to_string());
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let cfg_test = [p('#'), p('['), w("cfg"), p('('), w("test"), p(')'), p(']')];
        if toks.len() >= i + cfg_test.len() && toks[i..i + cfg_test.len()].iter().map(|t| &t.0).eq(cfg_test.iter()) {
            i += cfg_test.len();
            let mut depth = 0;
            while i < toks.len() {
                match toks[i].0 {
                    Tok::Punct('{') => depth += 1,
                    Tok::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    Tok::Punct(';') if depth == 0 => {
                        i += 1;
                        break;
                    }
                    _ => {}
                }
                i += 1;
            }
            continue;
        }
        out.push(toks[i].clone());
        i += 1;
    }
    out
}

/// A message found in the code: where, and its format string.
#[derive(Debug)]
struct Message {
    file: PathBuf,
    line: usize,
    text: String,
}

const MACROS: &[&str] = &["eprintln", "errln", "bail", "anyhow", "warn", "error"];

/// The message literals of one source file.
fn messages(file: &Path, src: &str) -> Vec<Message> {
    let toks = without_test_code(lex(src));
    let tok = |i: usize| toks.get(i).map(|t| &t.0);
    let word = |i: usize, s: &str| matches!(tok(i), Some(Tok::Word(x)) if x == s);
    let punct = |i: usize, ch: char| tok(i) == Some(&Tok::Punct(ch));
    // The literal at `i`, or at `i + 3` after `format!(`.
    let literal_at = |i: usize| -> Option<(String, usize)> {
        let i = if word(i, "format") && punct(i + 1, '!') && punct(i + 2, '(') { i + 3 } else { i };
        match tok(i) {
            Some(Tok::Str { text, bytes: false }) => Some((text.clone(), toks[i].1)),
            _ => None,
        }
    };
    let mut found = Vec::new();
    for i in 0..toks.len() {
        let hit = if punct(i, '#') && punct(i + 1, '[') && word(i + 2, "error") && punct(i + 3, '(') {
            literal_at(i + 4)
        } else if MACROS.iter().any(|m| word(i, m)) && punct(i + 1, '!') && punct(i + 2, '(') {
            // The first literal inside the macro's parentheses (tracing fields may come before it).
            let mut depth = 0;
            let mut j = i + 2;
            loop {
                match tok(j) {
                    None => break None,
                    Some(Tok::Punct('(' | '[' | '{')) => depth += 1,
                    Some(Tok::Punct(')' | ']' | '}')) => {
                        depth -= 1;
                        if depth == 0 {
                            break None;
                        }
                    }
                    Some(Tok::Str { .. }) if depth == 1 => break literal_at(j),
                    _ => {}
                }
                j += 1;
            }
        } else if word(i, "bad") && punct(i + 1, '(') && !punct(i.wrapping_sub(1), '.') {
            literal_at(i + 2)
        } else if matches!(tok(i), Some(Tok::Word(w)) if w.ends_with("Error"))
            && punct(i + 1, ':')
            && punct(i + 2, ':')
            && matches!(tok(i + 3), Some(Tok::Word(_)))
            && punct(i + 4, '(')
        {
            literal_at(i + 5)
        } else if word(i, "reason") && punct(i + 1, ':') && !punct(i + 2, ':') {
            literal_at(i + 2)
        } else {
            None
        };
        if let Some((text, line)) = hit {
            found.push(Message { file: file.to_path_buf(), line, text });
        }
    }
    found
}

/// The literal pieces of a format string, in order: `{...}` placeholders split them, `{{` and `}}` are
/// braces; each piece with its whitespace collapsed and trimmed, empty ones dropped.
fn pieces(format: &str) -> Vec<String> {
    let (mut out, mut cur) = (Vec::new(), String::new());
    let mut chars = format.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '{' | '}' if chars.peek() == Some(&ch) => {
                chars.next();
                cur.push(ch);
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                out.push(std::mem::take(&mut cur));
            }
            _ => cur.push(ch),
        }
    }
    out.push(cur);
    out.iter().map(|s| collapse(s)).filter(|s| !s.is_empty()).collect()
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether one line of `doc` holds `pieces` in order.
fn documented(doc_lines: &[String], pieces: &[String]) -> bool {
    doc_lines.iter().any(|line| {
        let mut rest = line.as_str();
        pieces.iter().all(|p| match rest.find(p.as_str()) {
            Some(at) => {
                rest = &rest[at + p.len()..];
                true
            }
            None => false,
        })
    })
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            sources(&path, out);
        } else if name.ends_with(".rs") && name != "tests.rs" && name != "fuzz.rs" {
            out.push(path);
        }
    }
}

#[test]
fn every_message_in_the_code_is_in_docs_errors_md() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/errors.md")).expect("docs/errors.md exists");
    let doc_lines: Vec<String> = doc.lines().map(collapse).collect();
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut found = Vec::new();
    for file in &files {
        let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        found.extend(messages(file.strip_prefix(root).unwrap_or(file), &src));
    }
    assert!(found.len() > 100, "the scan finds the messages ({} found): is the scanner broken?", found.len());
    let missing: Vec<String> = found
        .iter()
        .filter(|m| !pieces(&m.text).is_empty() && !documented(&doc_lines, &pieces(&m.text)))
        .map(|m| format!("  {}:{}: {:?}", m.file.display(), m.line, m.text))
        .collect();
    assert!(
        missing.is_empty(),
        "{} message(s) are not in docs/errors.md; add each, with its cause and fix, to the section of its area \
         (a `{{...}}` placeholder may be written as anything, the rest must be verbatim on one line):\n{}",
        missing.len(),
        missing.join("\n")
    );
}

/// `print!`, `println!`, `eprint!` and `eprintln!` panic when the console is gone (a hung-up terminal, a
/// closed pipe), which would cost the agent its stop and its exit code; muster writes through `console.rs`.
#[test]
fn the_code_writes_to_stdout_and_stderr_only_through_console_rs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut found = Vec::new();
    for file in files.iter().filter(|f| !f.to_string_lossy().ends_with("_tests.rs")) {
        let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let toks = without_test_code(lex(&src));
        for pair in toks.windows(2) {
            if let [(Tok::Word(w), line), (Tok::Punct('!'), _)] = pair {
                if ["print", "println", "eprint", "eprintln"].contains(&w.as_str()) {
                    found.push(format!("  {}:{line}: {w}!", file.strip_prefix(root).unwrap_or(file).display()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "use crate::outln!/out!/errln! (src/console.rs), which never panic, instead of:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scanner_reads_multi_line_literals_and_skips_test_code() {
    let src = concat!(
        "#[derive(thiserror::Error)]\n",
        "enum E {\n",
        "    #[error(\"first {x} part, \\\n",
        "             continued\")]\n",
        "    A { x: u8 },\n",
        "    #[error(r#\"raw \"{0}\" text\"#)]\n",
        "    B(String),\n",
        "}\n",
        "fn f(c: char) -> Result<(), ConfigError> {\n",
        "    let _ = '\"'; let _: &'static str = \"\";\n",
        "    tracing::warn!(pid = 3, \"a {{literal}} brace\nand a line break\");\n",
        "    crate::errln!(\"muster: {c} lost\");\n",
        "    Err(bad(format!(\"config {c}\")))\n",
        "}\n",
        "#[cfg(test)]\n",
        "mod tests { fn g() { eprintln!(\"not a message\"); } }\n",
        "// eprintln!(\"commented out\");\n",
    );
    let texts: Vec<String> = messages(Path::new("x.rs"), src).into_iter().map(|m| m.text).collect();
    assert_eq!(texts, ["first {x} part, continued", "raw \"{0}\" text", "a {{literal}} brace\nand a line break", "muster: {c} lost", "config {c}"]);
    assert_eq!(pieces("first {x} part, continued"), ["first", "part, continued"]);
    assert_eq!(pieces("a {{literal}} brace\nand  {0:?}"), ["a {literal} brace and"]);
    let doc = vec![collapse("- `first <x> part, continued`: ..."), collapse("`a {literal} brace and`")];
    assert!(documented(&doc, &pieces("first {x} part, continued")));
    assert!(documented(&doc, &pieces("a {{literal}} brace\nand {0:?}")));
    assert!(!documented(&doc, &pieces("part, continued {x} first")), "pieces in order");
}
