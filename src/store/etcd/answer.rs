//! What each etcd member answered a call that failed, in the words a user reads (pure): never a library's
//! `Debug` rendering (tonic's `Status` shows its source's), and every member once, so that the line saying
//! no member answered says what each one did.

use std::fmt;
use std::time::Duration;

use tonic::{Code, Status};

/// One member's answer to one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    /// Nothing listens on its port: the connection was refused.
    Refused,
    /// The attempt's bound passed with no reply.
    Silent(Duration),
    /// Anything else, in words.
    Said(String),
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Refused => write!(f, "refused the connection (nothing listens there)"),
            Answer::Silent(bound) => write!(f, "did not answer within {bound:?}"),
            Answer::Said(words) => write!(f, "{words}"),
        }
    }
}

/// What a failed call's status says: the I/O error under it where there is one, else its message.
pub(super) fn of_status(status: &Status) -> Answer {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return of_io(io);
        }
        source = e.source();
    }
    of_message(status.code(), status.message())
}

fn of_io(io: &std::io::Error) -> Answer {
    use std::io::ErrorKind::*;
    match io.kind() {
        ConnectionRefused => Answer::Refused,
        TimedOut => Answer::Said("did not accept the connection in time".into()),
        ConnectionReset | ConnectionAborted | BrokenPipe => Answer::Said("reset the connection".into()),
        HostUnreachable | NetworkUnreachable => Answer::Said("cannot be reached (no route to it)".into()),
        _ => Answer::Said(io.to_string()),
    }
}

/// A status without an I/O error under it: tonic's connection errors carry theirs as text.
fn of_message(code: Code, message: &str) -> Answer {
    let lower = message.to_ascii_lowercase();
    if lower.contains("connection refused") {
        Answer::Refused
    } else if lower.contains("dns error") || lower.contains("failed to lookup address") {
        Answer::Said("its name does not resolve".into())
    } else if lower.contains("connection reset") || lower.contains("broken pipe") {
        Answer::Said("reset the connection".into())
    } else if code == Code::DeadlineExceeded && message.is_empty() {
        Answer::Said("did not answer in time".into())
    } else if message.is_empty() {
        Answer::Said(format!("answered: {}", code.description()))
    } else {
        Answer::Said(format!("answered: {message}"))
    }
}

/// The last answer of each member in one call, by member.
pub(super) struct Answers(Vec<Option<Answer>>);

impl Answers {
    pub(super) fn new(members: usize) -> Answers {
        Answers(vec![None; members])
    }

    pub(super) fn set(&mut self, member: usize, answer: Answer) {
        if let Some(slot) = self.0.get_mut(member) {
            *slot = Some(answer);
        }
    }

    /// Every member refused the connection (none listens).
    pub(super) fn all_refused(&self) -> bool {
        self.0.iter().all(|a| *a == Some(Answer::Refused))
    }

    /// `http://h1:2379 refused the connection (nothing listens there), http://h2:2379 did not answer
    /// within 2s`: each member that was tried, by its URL.
    pub(super) fn line(&self, urls: &[&str]) -> String {
        let each: Vec<String> = self.0.iter().zip(urls).filter_map(|(a, url)| a.as_ref().map(|a| format!("{url} {a}"))).collect();
        if each.is_empty() {
            "no member was tried".into()
        } else {
            each.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_reads_as_words() {
        // (code, message, what the member answered)
        let table = [
            (Code::Unavailable, "Connection refused (os error 111)", "refused the connection (nothing listens there)"),
            (Code::Unavailable, "transport error: tcp connect error: Connection refused", "refused the connection (nothing listens there)"),
            (Code::Unavailable, "dns error: failed to lookup address information", "its name does not resolve"),
            (Code::Unavailable, "etcdserver: no leader", "answered: etcdserver: no leader"),
            (Code::Unavailable, "Connection reset by peer (os error 104)", "reset the connection"),
            (Code::DeadlineExceeded, "", "did not answer in time"),
            (Code::Unavailable, "", "answered: The service is currently unavailable"),
        ];
        for (code, message, want) in table {
            let got = of_status(&Status::new(code, message)).to_string();
            assert_eq!(got, want, "{code:?} {message}");
            assert!(!got.contains("Error(") && !got.contains("source:"), "no Debug rendering: {got}");
        }
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(of_io(&io), Answer::Refused);
    }

    #[test]
    fn the_line_says_what_each_member_answered() {
        let urls = ["http://a:2379", "http://b:2379", "http://c:2379"];
        let mut answers = Answers::new(3);
        assert_eq!(answers.line(&urls), "no member was tried");
        answers.set(0, Answer::Refused);
        answers.set(2, Answer::Silent(Duration::from_secs(2)));
        assert_eq!(answers.line(&urls), "http://a:2379 refused the connection (nothing listens there), http://c:2379 did not answer within 2s");
        assert!(!answers.all_refused());
        answers.set(1, Answer::Refused);
        answers.set(2, Answer::Refused);
        assert!(answers.all_refused());
    }
}
