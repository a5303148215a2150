//! The node agent against its own node: an unprivileged user's perf maps
//! and unwind sections stay within the receiver's state budget
//! (`max_state_size`), and are given back when the processes exit.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, KillOnDrop, Ports, Proflow};
use crate::ebpf_support::require_root;
use crate::peer_env;

/// Compiles `source` (C) into `dir/name` with `flags`; panics with cc's
/// output if it fails.
fn cc(dir: &Path, name: &str, source: &str, flags: &[&str]) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let bin = dir.join(name);
    run_ok(Command::new("cc").args(flags).arg("-o").arg(&bin).arg(&src));
    bin
}

/// Runs `cmd`; panics with its error output if it fails.
fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The two attacks of one unprivileged user of the node on the agent's
/// memory, eight processes each: processes that run in anonymous
/// executable memory, each with a 16 MiB perf map of 1.2 M short lines (one
/// file hard-linked as `/tmp/perf-PID.map` for every one), and copies of a
/// tiny binary whose compressed `.debug_frame` inflates to 60 MiB. With the
/// receiver's defaults (`max_state_size` 64MiB) the agent stays under
/// 150 MB throughout (30 s of both attacks at least, and until it has met
/// both), refuses what does not fit (counted by use), and is back within
/// 10% of its idle size (at work on one ordinary process) 30 s after they
/// exit.
#[test]
fn a_users_perf_maps_and_debug_frames_stay_within_the_state_budget() {
    let _root = require_root();
    const NOBODY: u32 = 65534;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let chown = |p: &Path| std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    // Spins in a page of anonymous executable memory (`jmp .`).
    let jit = cc(
        dir.path(),
        "jit",
        "#include <sys/mman.h>\n#include <string.h>\n\
         int main(void) {\n\
           unsigned char *p = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);\n\
           if (p == MAP_FAILED) return 1;\n\
           p[0] = 0xeb; p[1] = 0xfe;\n\
           ((void (*)(void))p)();\n\
           return 0;\n\
         }\n",
        &["-O0"],
    );
    // A busy loop, its unwind information only in a compressed
    // .debug_frame of 60 MiB of zeros.
    let spin = cc(
        dir.path(),
        "spin",
        "int main(void) { for (;;) {} }\n",
        &["-O0"],
    );
    let zeros = dir.path().join("zeros");
    std::fs::write(&zeros, vec![0u8; 60 << 20]).unwrap();
    run_ok(
        Command::new("objcopy")
            .args(["--remove-section", ".eh_frame"])
            .args(["--remove-section", ".eh_frame_hdr"])
            .arg("--add-section")
            .arg(format!(".debug_frame={}", zeros.display()))
            .arg(&spin),
    );
    // Compressed in a second step: the step that adds a section does not
    // compress it.
    run_ok(
        Command::new("objcopy")
            .arg("--compress-debug-sections=zlib-gabi")
            .arg(&spin),
    );
    std::fs::remove_file(&zeros).unwrap();
    let spin_size = std::fs::metadata(&spin).unwrap().len();
    assert!(
        spin_size < 1 << 20,
        "the binary is small on disk: {spin_size}"
    );
    // The perf map: 16 MiB of one-byte functions named `f`, owned by the
    // user (a map must be the process's user's or root's).
    let map = dir.path().join("perf.map");
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(&map).unwrap());
        let mut written = 0usize;
        let mut addr = 0x10_0000_0000u64;
        while written < 16 << 20 {
            let line = format!("{addr:x} 1 f\n");
            w.write_all(line.as_bytes()).unwrap();
            written += line.len();
            addr += 1;
        }
    }
    chown(&map);

    // The agent first, keeping the processes of programs in `dir`: its
    // idle size is measured before anything of theirs is read. At the
    // default sampling rate (19 Hz) and so the default ring buffer (512 KiB
    // here): at 997 Hz it would be 16 MiB, mapped twice (32 MiB of RSS
    // whatever the attack).
    let exe = format!("{}/.*", dir.path().display());
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    collect_interval: 5s\n    relabel_configs:\n      - {{source_labels: [__meta_process_exe], regex: '{exe}', action: keep}}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry
        )
    });
    // Idle means at work on an ordinary process of its own: a busy loop
    // of root's, with its .eh_frame, sampled for two intervals (the stacks,
    // symbols and buffers that any sampling holds are in the baseline).
    let busy = cc(
        dir.path(),
        "busy",
        "int main(void) { for (;;) {} }\n",
        &["-O0"],
    );
    let _busy = KillOnDrop(
        Command::new(&busy)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(12));
    let idle = proflow.rss_bytes();

    let user = |bin: &Path| {
        let mut cmd = Command::new(bin);
        std::os::unix::process::CommandExt::uid(&mut cmd, NOBODY);
        std::os::unix::process::CommandExt::gid(&mut cmd, NOBODY);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        KillOnDrop(cmd.spawn().unwrap())
    };
    struct Unlink(Vec<std::path::PathBuf>);
    impl Drop for Unlink {
        fn drop(&mut self) {
            for l in &self.0 {
                let _ = std::fs::remove_file(l);
            }
        }
    }
    let mut links = Unlink(Vec::new());
    let mut children = Vec::new();
    for i in 0..8 {
        let child = user(&jit);
        let link = std::path::PathBuf::from(format!("/tmp/perf-{}.map", child.0.id()));
        let _ = std::fs::remove_file(&link);
        std::fs::hard_link(&map, &link).unwrap();
        links.0.push(link);
        children.push(child);
        let copy = dir.path().join(format!("spin-{i}"));
        std::fs::copy(&spin, &copy).unwrap();
        chown(&copy);
        children.push(user(&copy));
    }

    // At least 30 s of both attacks, and until the agent has met them (its
    // state charged, and something refused): on a machine as busy as this one
    // (17 busy loops on the test machine's two cores) the agent gets only
    // its share of the CPU, and reading the attackers' files takes it
    // longer; what is bounded here is its memory, not its speed.
    let mut peak = 0;
    let started = Instant::now();
    let met = |metrics: &str| {
        let refused = |what: &str| {
            common::metric_sum(
                metrics,
                "proflow_ebpf_state_refusals_total",
                &[("use", what)],
            )
        };
        common::metric_sum(metrics, "proflow_ebpf_state_bytes", &[]) > 0.0
            && refused("perf_map") + refused("unwind_section") >= 1.0
    };
    let mut metrics = String::new();
    while started.elapsed() < Duration::from_secs(150) {
        peak = peak.max(proflow.rss_bytes());
        if started.elapsed() >= Duration::from_secs(30) {
            metrics = proflow.metrics();
            if met(&metrics) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let attacked = started.elapsed();
    // The kernel's high-water mark misses no peak between two reads.
    peak = peak.max(common::peak_rss_bytes(proflow.pid()));
    let state = common::metric_sum(&metrics, "proflow_ebpf_state_bytes", &[]);
    let refused = |what: &str| {
        common::metric_sum(
            &metrics,
            "proflow_ebpf_state_refusals_total",
            &[("use", what)],
        )
    };
    eprintln!(
        "agent RSS: idle {} MiB, peak {} MiB under attack ({} s); state {} MiB; refusals: perf_map {}, unwind_section {}",
        idle >> 20,
        peak >> 20,
        attacked.as_secs(),
        state as u64 >> 20,
        refused("perf_map"),
        refused("unwind_section")
    );
    assert!(
        state > 0.0 && state <= (64 << 20) as f64,
        "the state is charged and within max_state_size: {state} (processes kept: {exe}; profiles written: {:?})\n{metrics}\n{}",
        common::read_index(&proflow.profiles)
            .iter()
            .map(|e| e.label("comm").unwrap_or_default().to_owned())
            .collect::<Vec<_>>(),
        proflow.log_text()
    );
    assert!(
        refused("perf_map") + refused("unwind_section") >= 1.0,
        "what did not fit was refused and counted:\n{metrics}"
    );
    assert!(
        peak <= 150 << 20,
        "the agent held {} MiB under the attack (idle {} MiB)\n{}",
        peak >> 20,
        idle >> 20,
        proflow.log_text()
    );

    // They exit: everything is given back, and the heap goes back to the
    // system at the next trims.
    drop(children);
    let back = peer_env::poll(Duration::from_secs(30), || {
        let rss = proflow.rss_bytes();
        (rss <= idle + idle / 10).then_some(rss)
    });
    assert!(
        back.is_some(),
        "30 s after they exited the agent still held {} MiB (idle {} MiB); state {} bytes",
        proflow.rss_bytes() >> 20,
        idle >> 20,
        common::metric_sum(&proflow.metrics(), "proflow_ebpf_state_bytes", &[])
    );
}
