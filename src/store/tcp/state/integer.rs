//! Integer values read as torch's servers read them.

/// The integer at the start of `value`, read as C's `strtoll` (torch's `std::stoll`): leading
/// whitespace and a sign allowed, trailing bytes ignored, no digits or overflow is an error.
pub(super) fn parse_leading_integer(value: &[u8]) -> Option<i64> {
    let start = value
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'..=b'\r'))?;
    let rest = &value[start..];
    let (negative, digits) = match rest.split_first() {
        Some((b'-', digits)) => (true, digits),
        Some((b'+', digits)) => (false, digits),
        _ => (false, rest),
    };
    let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    if len == 0 {
        return None;
    }
    digits[..len].iter().try_fold(0i64, |acc, d| {
        let d = i64::from(d - b'0');
        let acc = acc.checked_mul(10)?;
        if negative {
            acc.checked_sub(d)
        } else {
            acc.checked_add(d)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::parse_leading_integer;

    #[test]
    fn integers_parse_like_stoll() {
        assert_eq!(parse_leading_integer(b"3"), Some(3));
        assert_eq!(parse_leading_integer(b" 12xyz"), Some(12));
        assert_eq!(parse_leading_integer(b"\t-7"), Some(-7));
        assert_eq!(parse_leading_integer(b"+5"), Some(5));
        assert_eq!(
            parse_leading_integer(b"-9223372036854775808"),
            Some(i64::MIN)
        );
        assert_eq!(parse_leading_integer(b"9223372036854775808"), None);
        assert_eq!(parse_leading_integer(b"abc"), None);
        assert_eq!(parse_leading_integer(b"-"), None);
        assert_eq!(parse_leading_integer(b""), None);
    }
}
