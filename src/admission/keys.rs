//! API keys: loaded from `ISOBOX_API_KEYS` or `ISOBOX_API_KEYS_FILE`, kept only as
//! SHA-256 digests, compared in constant time, never logged.

use ring::digest::{digest, SHA256};
use std::path::Path;
use subtle::ConstantTimeEq;

/// A configured key, stored as its digest; the tenant is derived from the digest.
#[derive(Clone)]
pub struct Key {
    digest: [u8; 32],
    /// Server-side tenant name of this key.
    pub tenant: String,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.tenant)
    }
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, b).as_ref());
    out
}

impl Key {
    /// Hashes a key. Its tenant is `key-` + the first 8 bytes of a digest of the
    /// digest (so the tenant name reveals nothing usable about the key).
    pub fn new(secret: &str) -> Key {
        let d = sha256(secret.as_bytes());
        let t = sha256(&d);
        let tenant = format!(
            "key-{}",
            t[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        Key { digest: d, tenant }
    }
}

/// Parses a comma- or newline-separated key list; blank entries and `#` comment lines
/// are skipped.
pub fn parse_list(text: &str) -> Vec<Key> {
    text.split(['\n', ','])
        .map(str::trim)
        .filter(|k| !k.is_empty() && !k.starts_with('#'))
        .map(Key::new)
        .collect()
}

/// Reads a key file (one key per line).
///
/// # Errors
/// When the file cannot be read.
pub fn load_file(path: &Path) -> std::io::Result<Vec<Key>> {
    Ok(parse_list(&std::fs::read_to_string(path)?))
}

/// Whether `presented` hashes to `digest` (compared in constant time).
pub fn digest_eq(digest: &[u8; 32], presented: &str) -> bool {
    bool::from(digest.ct_eq(&sha256(presented.as_bytes())))
}

/// The SHA-256 digest a key is kept as.
pub fn key_digest(key: &str) -> [u8; 32] {
    sha256(key.as_bytes())
}

/// Finds the key matching `presented`, comparing against every key in constant time
/// (digests of equal length, no early exit), so timing reveals neither which key nor how
/// many bytes matched.
pub fn find<'a>(keys: &'a [Key], presented: &str) -> Option<&'a Key> {
    let p = sha256(presented.as_bytes());
    let mut found = None;
    for k in keys {
        let equal = bool::from(k.digest.ct_eq(&p));
        // Branch-free selection would be overkill: the digest comparison above is what
        // must not leak, and every key is always compared.
        if equal && found.is_none() {
            found = Some(k);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_and_find() {
        let keys = parse_list("alpha, beta\n# comment\n\n gamma ");
        assert_eq!(keys.len(), 3);
        assert!(find(&keys, "beta").is_some());
        assert!(find(&keys, "beta ").is_none());
        assert!(find(&keys, "bet").is_none());
        assert!(find(&keys, "").is_none());
        assert_ne!(
            find(&keys, "alpha").unwrap().tenant,
            find(&keys, "gamma").unwrap().tenant
        );
        assert!(find(&keys, "alpha").unwrap().tenant.starts_with("key-"));
        assert!(!format!("{:?}", keys[0]).contains("alpha"));
    }

    #[test]
    fn test_find_every_key_and_near_misses() {
        let keys = parse_list("k1,k2,k3");
        // Each key is found, whatever its position (the loop never stops early).
        for (i, secret) in ["k1", "k2", "k3"].iter().enumerate() {
            assert_eq!(find(&keys, secret).unwrap().tenant, keys[i].tenant);
        }
        // A digest one byte off matches no key.
        let mut near = keys[1].clone();
        near.digest[31] ^= 1;
        assert!(find(&[near.clone()], "k2").is_none());
        near.digest[31] ^= 1;
        near.digest[0] ^= 0x80;
        assert!(find(&[near], "k2").is_none());
        // Duplicate keys: the first one wins.
        let dup = parse_list("same,same");
        assert!(std::ptr::eq(find(&dup, "same").unwrap(), &dup[0]));
        assert!(find(&[], "k1").is_none());
    }
}
