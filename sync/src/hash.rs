use sha2::{Digest, Sha256};

/// A SHA-256 digest naming a chunk (or a manifest) by its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    pub const LEN: usize = 32;

    /// The SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Hash {
        Hash(Sha256::digest(bytes).into())
    }

    /// Builds a hash from exactly 32 bytes (as they arrive on the wire).
    pub fn from_slice(bytes: &[u8]) -> Result<Hash, crate::SyncError> {
        let arr: [u8; 32] = bytes.try_into().map_err(|_| {
            crate::SyncError::Invalid(format!("hash must be 32 bytes, got {}", bytes.len()))
        })?;
        Ok(Hash(arr))
    }

    pub fn from_hex(s: &str) -> Result<Hash, crate::SyncError> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out)
            .map_err(|e| crate::SyncError::Invalid(format!("bad hash {s:?}: {e}")))?;
        Ok(Hash(out))
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Checks that `bytes` hash to `self`; the error names both digests.
    pub fn verify(&self, bytes: &[u8]) -> Result<(), crate::SyncError> {
        let actual = Hash::of(bytes);
        if actual != *self {
            return Err(crate::SyncError::HashMismatch {
                hash: *self,
                actual,
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for Hash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl std::fmt::Debug for Hash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hash({})", &hex::encode(self.0)[..16])
    }
}
