//! Tokens at rest: sealed with ChaCha20-Poly1305 under a 32-byte key kept
//! in the data directory (`oauth.key`, mode 0600, made on first start).
//! A sealed value is base64 of a random 12-byte nonce followed by the
//! ciphertext, so the database alone reveals no token.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::RngCore;

use crate::error::KernelError;

/// The key file's name in the data directory.
pub const KEY_FILE: &str = "oauth.key";
const NONCE_LEN: usize = 12;

/// Seals and opens token text.
pub struct TokenSeal {
    cipher: ChaCha20Poly1305,
}

impl std::fmt::Debug for TokenSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSeal")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("{path}: {source}")]
    KeyFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds {len} bytes, not a 32-byte key")]
    KeyLength { path: PathBuf, len: usize },
    #[error("a sealed token does not open (wrong key or damaged row)")]
    Open,
}

impl From<SealError> for KernelError {
    fn from(e: SealError) -> Self {
        KernelError::internal("OAuth token seal", e)
    }
}

impl TokenSeal {
    /// The seal of `dir`'s key file, made (0600) when there is none.
    pub fn open_or_create(dir: &Path) -> Result<TokenSeal, SealError> {
        let path = dir.join(KEY_FILE);
        let io = |source| SealError::KeyFile {
            path: path.clone(),
            source,
        };
        let key = match std::fs::read(&path) {
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = vec![0u8; 32];
                rand::rng().fill_bytes(&mut key);
                let mut opts = std::fs::OpenOptions::new();
                opts.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
                let mut f = opts.open(&path).map_err(io)?;
                f.write_all(&key).and_then(|()| f.sync_all()).map_err(io)?;
                key
            }
            Err(e) => return Err(io(e)),
        };
        if key.len() != 32 {
            return Err(SealError::KeyLength {
                path,
                len: key.len(),
            });
        }
        Ok(TokenSeal {
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
        })
    }

    pub fn seal(&self, plain: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), plain.as_bytes())
            .expect("ChaCha20-Poly1305 seals any length a token has");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        STANDARD.encode(out)
    }

    pub fn open(&self, sealed: &str) -> Result<String, SealError> {
        let bytes = STANDARD.decode(sealed).map_err(|_| SealError::Open)?;
        if bytes.len() < NONCE_LEN {
            return Err(SealError::Open);
        }
        let (nonce, body) = bytes.split_at(NONCE_LEN);
        let plain = self
            .cipher
            .decrypt(Nonce::from_slice(nonce), body)
            .map_err(|_| SealError::Open)?;
        String::from_utf8(plain).map_err(|_| SealError::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_token_opens_with_its_key_only_and_the_key_file_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let seal = TokenSeal::open_or_create(dir.path()).unwrap();
        let sealed = seal.seal("access-token-123");
        assert!(!sealed.contains("access-token-123"));
        assert_ne!(
            sealed,
            seal.seal("access-token-123"),
            "fresh nonce each time"
        );
        assert_eq!(seal.open(&sealed).unwrap(), "access-token-123");
        // The same directory gives the same key back.
        let again = TokenSeal::open_or_create(dir.path()).unwrap();
        assert_eq!(again.open(&sealed).unwrap(), "access-token-123");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let other = TokenSeal::open_or_create(tempfile::tempdir().unwrap().path()).unwrap();
        assert!(matches!(other.open(&sealed), Err(SealError::Open)));
        assert!(matches!(seal.open("not base64!"), Err(SealError::Open)));
    }
}
