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

/// How the agent names its token file (`muster store` has `--token-file`).
pub const RDZV_CONF_FLAG: &str = "--rdzv-conf token_file";

/// The token from `token_file` (given as `flag`, named in errors) if given, else from `$MUSTER_RDZV_TOKEN`;
/// `None` when neither is set. Surrounding whitespace (a file's trailing newline) is not part of it; an empty
/// token is an error, not "no token".
pub fn resolve(token_file: Option<&Path>, flag: &str, env: Option<String>) -> Result<Option<Token>, ConfigError> {
    let (text, source) = match token_file {
        Some(path) => {
            let source = format!("'{flag}={}'", path.display());
            let text = std::fs::read_to_string(path).map_err(|e| {
                bad(format!("{source}: cannot read it ({e}); name a readable file holding the job token"))
            })?;
            (text, source)
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
        let from_file = resolve(Some(&file), RDZV_CONF_FLAG, Some("from-env".into())).expect("token").expect("some");
        assert_eq!(from_file.bytes(), b"from-file");
        let from_env = resolve(None, RDZV_CONF_FLAG, Some(" from-env ".into())).expect("token").expect("some");
        assert_eq!(from_env.bytes(), b"from-env");
        assert_eq!(resolve(None, RDZV_CONF_FLAG, None).expect("none"), None);
        let empty = resolve(None, RDZV_CONF_FLAG, Some("  ".into())).expect_err("empty").to_string();
        assert!(empty.contains(TOKEN_ENV) && empty.contains("empty"), "{empty}");
        let missing = resolve(Some(&dir.path().join("nope")), RDZV_CONF_FLAG, None).expect_err("missing").to_string();
        assert!(missing.starts_with("'--rdzv-conf token_file=") && !missing.contains('\n'), "{missing}");
        std::fs::write(&file, "\n").expect("write");
        let empty_file = resolve(Some(&file), "--token-file", None).expect_err("empty file").to_string();
        assert!(empty_file.starts_with("'--token-file=") && empty_file.contains("empty"), "{empty_file}");
        assert_eq!(format!("{from_file:?}"), "Token(<redacted>)");
    }
}
