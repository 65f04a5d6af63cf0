//! Lowercase hex text for fixed-size ids (sessions, tokens).

use std::fmt;

/// Writes `bytes` as lowercase hex digits.
pub(crate) fn write(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
}

/// The `N` bytes spelled by exactly `2 * N` lowercase hex digits.
pub(crate) fn parse<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0u8; N];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = nibble(digits[2 * i])? << 4 | nibble(digits[2 * i + 1])?;
    }
    Some(bytes)
}
