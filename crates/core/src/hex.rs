//! Lowercase hex text for fixed-size ids (sessions, tokens).

use std::fmt;

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Writes `bytes` as lowercase hex digits.
///
/// Spelled into a stack buffer and written once: every event of the `/v1/events` ring and every
/// answer naming a session formats an id, and `write!` per byte cost ten times as much.
pub(crate) fn write(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    let mut buffer = [0u8; 64];
    for chunk in bytes.chunks(buffer.len() / 2) {
        for (pair, byte) in buffer.chunks_exact_mut(2).zip(chunk) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0xf)];
        }
        let text = &buffer[..2 * chunk.len()];
        f.write_str(std::str::from_utf8(text).expect("hex digits are ASCII"))?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use std::fmt;

    struct Hex<'a>(&'a [u8]);

    impl fmt::Display for Hex<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            super::write(f, self.0)
        }
    }

    #[test]
    fn writes_every_byte_as_two_lowercase_digits_at_any_length() {
        // Every byte value, and lengths around the stack buffer's size (32 bytes a chunk).
        let bytes: Vec<u8> = (0..=255u8).chain(0..=99u8).collect();
        for len in [0, 1, 16, 31, 32, 33, 64, 65, bytes.len()] {
            let expected: String = bytes[..len].iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(Hex(&bytes[..len]).to_string(), expected, "length {len}");
        }
        let id: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(super::parse::<16>(&Hex(&id).to_string()), Some(id));
    }
}
