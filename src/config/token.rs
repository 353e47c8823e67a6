//! The job token: what muster's agents present to the rendezvous store, so that nobody outside the job
//! can act on its rendezvous keys (docs/security.md).

use std::fmt;
use std::path::Path;

use super::{bad, ConfigError};

/// The environment variable holding the token (a `--rdzv-conf token_file=` wins over it).
pub const TOKEN_ENV: &str = "MUSTER_RDZV_TOKEN";

/// A job token; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl Token {
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The token from `token_file` if given, else from `$MUSTER_RDZV_TOKEN`; `None` when neither is set.
/// Surrounding whitespace (a file's trailing newline) is not part of it; an empty token is an error, not
/// "no token".
pub fn resolve(token_file: Option<&Path>, env: Option<String>) -> Result<Option<Token>, ConfigError> {
    let (text, source) = match token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                bad(format!("'--rdzv-conf token_file={}': cannot read it ({e}); name a readable file holding the job token", path.display()))
            })?;
            (text, format!("'--rdzv-conf token_file={}'", path.display()))
        }
        None => match env {
            Some(text) => (text, TOKEN_ENV.to_owned()),
            None => return Ok(None),
        },
    };
    let token = text.trim();
    if token.is_empty() {
        return Err(bad(format!("{source}: the job token is empty; give every agent the same non-empty token, or none")));
    }
    Ok(Some(Token(token.as_bytes().to_vec())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_wins_over_the_environment_and_empty_tokens_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        std::fs::write(&file, "from-file\n").expect("write");
        let from_file = resolve(Some(&file), Some("from-env".into())).expect("token").expect("some");
        assert_eq!(from_file.bytes(), b"from-file");
        let from_env = resolve(None, Some(" from-env ".into())).expect("token").expect("some");
        assert_eq!(from_env.bytes(), b"from-env");
        assert_eq!(resolve(None, None).expect("none"), None);
        let empty = resolve(None, Some("  ".into())).expect_err("empty").to_string();
        assert!(empty.contains(TOKEN_ENV) && empty.contains("empty"), "{empty}");
        let missing = resolve(Some(&dir.path().join("nope")), None).expect_err("missing").to_string();
        assert!(missing.contains("token_file=") && !missing.contains('\n'), "{missing}");
        assert_eq!(format!("{from_file:?}"), "Token(<redacted>)");
    }
}
