//! Checks of the real-peer harness, not of proflow: each module drives one
//! peer that `tests/peers/up` installs and starts (Pyroscope, Parca, Kafka,
//! the OpenTelemetry Collector) with the peer's own API, and reads back what
//! it stored, so that a broken install, version or start script shows up here
//! and not as a puzzling failure of a proflow test. proflow's own tests
//! against these peers come with the exporters that talk to them. The Kafka
//! module also checks a private broker of `tests/peers/private` across a
//! kill and restart (Pyroscope's and Parca's private instances are restarted
//! by `tests/backend_outages.rs`).
//!
//! Peers are had through `peer_env`; when one cannot be had these checks fail,
//! except locally with `PROFLOW_SKIP_PEERS=1` (see `peer_skip`).

#[path = "common/peer_env.rs"]
mod peer_env;
// Shared read-back helpers (the harness uses its timestamp formatting).
#[path = "common/readback.rs"]
mod readback;

#[path = "harness/kafka.rs"]
mod kafka;
#[path = "harness/otelcol.rs"]
mod otelcol;
#[path = "harness/parca.rs"]
mod parca;
#[path = "harness/pyroscope.rs"]
mod pyroscope;
