//! The `scrape` receiver: Prometheus-style `scrape_configs` that pull pprof
//! profiles from `/debug/pprof` endpoints, as Parca and Grafana Alloy's
//! `pyroscope.scrape` do.
//!
//! - [`config`]: the config (Prometheus's names, Alloy's defaults).
//! - [`discovery`]: where targets come from (static, file, HTTP).
//! - [`client`]: the HTTP client of scrapes and HTTP SD.

// The receiver is assembled over several commits; until it is registered,
// parts of it are not used yet.
#![allow(dead_code)]

pub mod client;
pub mod config;
pub mod discovery;

pub use config::ScrapeReceiverConfig;
