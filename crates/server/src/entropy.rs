//! A simple, documented estimate of how guessable an operator's secret is: the root token's
//! secret (`PERMIT_ROOT_TOKEN`, `--root-token-file`) and the cluster secret
//! (`--cluster-secret-file`) must each carry at least [`SECRET_BITS_MIN`] bits.
//!
//! The estimate (docs/security.md, "Operator secrets") is deliberately simple, and generous to
//! random strings only:
//! - the alphabet is the sum of the character classes the secret uses: 16 if every character is
//!   a hex digit, else 26 for `a-z`, 26 for `A-Z`, 10 for `0-9`, 33 for any other ASCII
//!   character, and 128 for any byte outside ASCII;
//! - a secret that repeats a shorter unit (`passwordpassword`, `abcabcab`) counts only that
//!   unit's length;
//! - bits = counted length × log2(alphabet);
//! - a secret of fewer than [`DISTINCT_CHARACTERS_MIN`] different characters is refused
//!   whatever its length (`000…01`).
//!
//! So 32 random hex digits are exactly 128 bits, 22 base64 characters (16 random bytes) about
//! 131, and `head -c 32 /dev/urandom | base64` (44 characters) about 262.

/// Fewest estimated bits an operator's secret must have.
const SECRET_BITS_MIN: f64 = 128.0;

/// Fewest different characters a secret must have.
const DISTINCT_CHARACTERS_MIN: usize = 8;

/// How to make a good secret, for error messages.
const GOOD_SECRET_HOWTO: &str =
    "use at least 32 random hex digits or 22 random base64 characters, for example \
     `head -c 32 /dev/urandom | base64` or `openssl rand -hex 32`";

/// A class of characters and how many it has.
type Class = (fn(&u8) -> bool, u32);

/// The estimated bits of `secret` (see the module docs).
fn estimate_bits(secret: &[u8]) -> f64 {
    if secret.is_empty() {
        return 0.0;
    }
    let alphabet: u32 = if secret.iter().all(u8::is_ascii_hexdigit) {
        16
    } else {
        let classes: [Class; 5] = [
            (u8::is_ascii_lowercase, 26),
            (u8::is_ascii_uppercase, 26),
            (u8::is_ascii_digit, 10),
            (|b| b.is_ascii() && !b.is_ascii_alphanumeric(), 33),
            (|b| !b.is_ascii(), 128),
        ];
        classes.iter().filter(|(class, _)| secret.iter().any(class)).map(|(_, size)| size).sum()
    };
    smallest_period(secret) as f64 * f64::from(alphabet).log2()
}

/// The length of the shortest unit that `secret` repeats (its smallest period: `secret[i] ==
/// secret[i - p]` for every `i >= p`); the whole length when it repeats nothing.
fn smallest_period(secret: &[u8]) -> usize {
    // Knuth-Morris-Pratt failure function: the longest proper border of the whole string.
    let mut border = vec![0usize; secret.len()];
    let mut k = 0;
    for i in 1..secret.len() {
        while k > 0 && secret[i] != secret[k] {
            k = border[k - 1];
        }
        if secret[i] == secret[k] {
            k += 1;
        }
        border[i] = k;
    }
    secret.len() - border.last().copied().unwrap_or(0)
}

/// Refuses a secret estimated under [`SECRET_BITS_MIN`] bits, or with fewer than
/// [`DISTINCT_CHARACTERS_MIN`] different characters. `what` names it in the message, which never
/// shows the secret.
///
/// # Errors
/// A message naming `what`, the estimate and how to make a good secret.
pub(crate) fn check(what: &str, secret: &[u8]) -> anyhow::Result<()> {
    let mut seen = [false; 256];
    for &byte in secret {
        seen[usize::from(byte)] = true;
    }
    let distinct = seen.iter().filter(|&&seen| seen).count();
    anyhow::ensure!(
        distinct >= DISTINCT_CHARACTERS_MIN,
        "{what} has only {distinct} different characters (at least {DISTINCT_CHARACTERS_MIN} needed): \
         it is too easy to guess; {GOOD_SECRET_HOWTO}"
    );
    let bits = estimate_bits(secret);
    anyhow::ensure!(
        bits >= SECRET_BITS_MIN,
        "{what} is too easy to guess: about {bits:.0} bits of entropy, fewer than {SECRET_BITS_MIN:.0} \
         (estimated from its length, the kinds of characters it uses and its repeats); {GOOD_SECRET_HOWTO}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_count_once() {
        assert_eq!(smallest_period(b"passwordpassword"), 8);
        assert_eq!(smallest_period(b"abcabcab"), 3);
        assert_eq!(smallest_period(b"aaaa"), 1);
        assert_eq!(smallest_period(b"abcd"), 4);
        assert_eq!(smallest_period(b""), 0);
    }

    #[test]
    fn weak_secrets_are_refused_and_random_ones_pass() {
        for weak in [
            &b"passwordpassword"[..],
            b"password",
            b"correcthorsebatt",
            b"0123456789abcdef0123456789abcdef",
            b"00000000000000000000000000000000000000000000000000001",
            b"deadbeefdeadbeefdeadbeefdeadbeefdeadbeef",
            b"0123456789abcdef0123456789abcde", // 31 hex digits: 124 bits
        ] {
            let refused = check("the secret", weak).unwrap_err().to_string();
            assert!(refused.contains("the secret"), "{refused}");
            assert!(!refused.contains(std::str::from_utf8(weak).unwrap()), "the message shows the secret");
        }
        for good in [
            &b"3f9a1c0e7b52d4869e0f3a7c1b5d2e84"[..], // 32 hex digits: 128 bits
            b"q2Xv9LmP0aTz7KcR4bWy1g",                // 22 base64 characters: 131 bits
            b"Zm9vYmFyYmF6cXV4cXV1eHF1dXpxdXV4ZmxvYmJsZQ==",
            b"root-secret-for-tests-0123456789abcdef",
        ] {
            check("the secret", good).unwrap();
        }
        assert_eq!(estimate_bits(b"3f9a1c0e7b52d4869e0f3a7c1b5d2e84"), 128.0);
    }
}
