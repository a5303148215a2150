//! What the OpAMP client keeps across restarts in `service.opamp.storage`:
//! the instance uid the server knows this proflow by (`instance_uid`, a
//! UUID in text), and the last remote config it applied
//! (`remote_config.yaml` with its hash in `remote_config.hash`), which
//! proflow starts with when the server cannot be reached. Each file is
//! written whole to a temporary name and renamed, so a crash leaves the old
//! file or the new one.

use std::path::{Path, PathBuf};

pub use proflow_model::otlp::hex;

/// The largest remote config read back (a config is a few kilobytes).
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// A remote config as the server sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    pub body: String,
    /// The server's hash of it (`config_hash`), reported back as applied
    /// or failed.
    pub hash: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct Storage {
    dir: PathBuf,
}

impl Storage {
    /// The directory, created if missing.
    pub fn open(dir: &Path) -> Result<Storage, String> {
        std::fs::create_dir_all(dir).map_err(|e| {
            format!(
                "service.opamp.storage {}: cannot create it: {e} (name a directory proflow may write)",
                dir.display()
            )
        })?;
        Ok(Storage {
            dir: dir.to_owned(),
        })
    }

    /// Writes `name` whole: a temporary file, synced, renamed over it, and
    /// the directory synced, so a crash or a power loss leaves the old file
    /// or the new one.
    fn write(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        use std::io::Write as _;
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| {
                f.write_all(bytes)?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, &path))
            .and_then(|()| std::fs::File::open(&self.dir)?.sync_all());
        written.map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// The instance uid kept here, or a new one (UUIDv7) written here.
    pub fn instance_uid(&self) -> Result<[u8; 16], String> {
        let path = self.dir.join("instance_uid");
        if let Ok(text) = std::fs::read_to_string(&path) {
            match parse_uuid(text.trim()) {
                Some(uid) => return Ok(uid),
                None => {
                    tracing::warn!(file = %path.display(), "not a UUID; a new instance uid replaces it")
                }
            }
        }
        let uid = new_uuid_v7()?;
        self.set_instance_uid(uid)?;
        Ok(uid)
    }

    /// Keeps `uid` (one the server assigned).
    pub fn set_instance_uid(&self, uid: [u8; 16]) -> Result<(), String> {
        self.write(
            "instance_uid",
            format!("{}\n", format_uuid(&uid)).as_bytes(),
        )
    }

    /// The last remote config applied, if one was kept.
    pub fn remote_config(&self) -> Option<RemoteConfig> {
        let path = self.dir.join("remote_config.yaml");
        let size = std::fs::metadata(&path).ok()?.len();
        if size > MAX_CONFIG_BYTES {
            tracing::warn!(file = %path.display(), size, "the kept remote config is too large to be one; ignored");
            return None;
        }
        let body = std::fs::read_to_string(&path).ok()?;
        let hash = std::fs::read_to_string(self.dir.join("remote_config.hash"))
            .ok()
            .and_then(|h| from_hex(h.trim()))
            .unwrap_or_default();
        Some(RemoteConfig { body, hash })
    }

    /// Keeps `config` as the last applied: the body first, so a crash
    /// between the two leaves the new body under the old hash; proflow then
    /// reports the old hash, and the server sends the new config again.
    pub fn set_remote_config(&self, config: &RemoteConfig) -> Result<(), String> {
        self.write("remote_config.yaml", config.body.as_bytes())?;
        self.write("remote_config.hash", hex(&config.hash).as_bytes())
    }
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(uid: &[u8; 16]) -> String {
    let h = hex(uid);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let bytes = from_hex(&text.replace('-', ""))?;
    bytes.try_into().ok()
}

/// A UUIDv7 (RFC 9562): milliseconds since the epoch, then random bits.
fn new_uuid_v7() -> Result<[u8; 16], String> {
    let mut uid = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut uid)
        .map_err(|_| "the system's random source failed".to_owned())?;
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    uid[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    uid[6] = 0x70 | (uid[6] & 0x0f);
    uid[8] = 0x80 | (uid[8] & 0x3f);
    Ok(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_uid_and_the_remote_config_outlive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(&dir.path().join("opamp")).unwrap();
        let uid = s.instance_uid().unwrap();
        assert_eq!(uid[6] >> 4, 7, "a version 7 UUID");
        assert_eq!(uid[8] >> 6, 0b10, "RFC 9562's variant");
        assert_eq!(parse_uuid(&format_uuid(&uid)), Some(uid));
        let again = Storage::open(&dir.path().join("opamp")).unwrap();
        assert_eq!(again.instance_uid().unwrap(), uid);
        assert_eq!(again.remote_config(), None);
        let config = RemoteConfig {
            body: "receivers: {}\n".into(),
            hash: vec![0xab, 0x01],
        };
        again.set_remote_config(&config).unwrap();
        assert_eq!(s.remote_config(), Some(config));
        std::fs::write(dir.path().join("opamp/instance_uid"), "not a uuid").unwrap();
        assert_ne!(s.instance_uid().unwrap(), uid);
    }
}
