//! The collector process's own CPU, memory and file descriptors under the
//! names every Prometheus client library gives them (`process_*`, no
//! `proflow_` prefix), so the agent dashboard and the usual process alerts
//! read them as they read any other service's. Read from `/proc/self` when
//! `/metrics` is asked for; on a system without `/proc` nothing is shown.

use std::fmt::Write as _;

/// The kernel reports CPU times in `/proc` in units of `USER_HZ`, which is
/// 100 on every Linux architecture (whatever the kernel's own tick rate).
const USER_HZ: f64 = 100.0;

/// The `process_*` families in OpenMetrics text, or nothing when `/proc`
/// cannot be read.
pub(super) fn render() -> String {
    let mut out = String::new();
    let Some(stat) = read("/proc/self/stat").and_then(|s| Stat::parse(&s)) else {
        return out;
    };
    let status = read("/proc/self/status").unwrap_or_default();
    family(
        &mut out,
        "process_cpu_seconds",
        "counter",
        "Total user and system CPU time spent in seconds",
        "process_cpu_seconds_total",
        Some((stat.utime + stat.stime) as f64 / USER_HZ),
    );
    family(
        &mut out,
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes",
        "process_resident_memory_bytes",
        status_kib(&status, "VmRSS:").map(|k| k * 1024.0),
    );
    family(
        &mut out,
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes",
        "process_virtual_memory_bytes",
        Some(stat.vsize as f64),
    );
    let boot = read("/proc/stat").and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    });
    family(
        &mut out,
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds",
        "process_start_time_seconds",
        boot.map(|b| b + stat.starttime as f64 / USER_HZ),
    );
    let open = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as f64);
    family(
        &mut out,
        "process_open_fds",
        "gauge",
        "Number of open file descriptors",
        "process_open_fds",
        open.ok(),
    );
    let max = read("/proc/self/limits").and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
    });
    family(
        &mut out,
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors",
        "process_max_fds",
        max,
    );
    out
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// One family of one sample without labels; nothing when `value` is unknown.
fn family(out: &mut String, name: &str, kind: &str, help: &str, sample: &str, value: Option<f64>) {
    let Some(value) = value else {
        return;
    };
    let _ = writeln!(out, "# HELP {name} {help}.");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{sample} {value}");
}

/// A `/proc/self/status` line's value in KiB (`VmRSS:   1234 kB`).
fn status_kib(status: &str, key: &str) -> Option<f64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// The fields of `/proc/self/stat` used here.
#[derive(Debug, PartialEq)]
struct Stat {
    utime: u64,
    stime: u64,
    starttime: u64,
    vsize: u64,
}

impl Stat {
    /// Fields counted from after the command name's closing `)` (the name
    /// may hold spaces and parentheses): field 3 (state) is the first.
    fn parse(s: &str) -> Option<Stat> {
        let rest = &s[s.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let at = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            utime: at(14)?,
            stime: at(15)?,
            starttime: at(22)?,
            vsize: at(23)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1 0 0 0 250 75 0 0 20 0 9 0 123456 987654321 2000 18446744073709551615";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                utime: 250,
                stime: 75,
                starttime: 123456,
                vsize: 987654321
            })
        );
        assert_eq!(Stat::parse("4242 (short) S 1"), None);
    }

    #[test]
    fn this_process_reports_its_cpu_memory_and_descriptors() {
        let text = render();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            let value: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
                .parse()
                .unwrap();
            // A test process may not have used 10 ms of CPU yet.
            let least = if name.starts_with("process_cpu") {
                0.0
            } else {
                1.0
            };
            assert!(value >= least, "{name}{value}");
        }
    }
}
