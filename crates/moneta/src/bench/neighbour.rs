//! The `--neighbour`: a second bench process reading beside the measured one.

use super::*;

/// The `--neighbour`: another `moneta bench` process on the same daemon, reading 1 MiB at a
/// time through all 64 of its tags for `seconds`.
pub(super) struct Neighbour {
    child: Option<std::process::Child>,
}

impl Neighbour {
    /// Starts it and returns once its reads are flowing (the daemon has read more than the
    /// region the neighbour wrote first).
    pub(super) fn start(
        socket: &std::path::Path,
        seconds: f64,
        a: &BenchArgs,
    ) -> Result<Neighbour, String> {
        let ctl = Control::connect(socket).map_err(|e| e.to_string())?;
        let before = ctl.status().map_err(|e| e.to_string())?.bytes_read;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let child = std::process::Command::new(exe)
            .args([
                "bench",
                "--path",
                "moneta-raw",
                "--op",
                "read",
                "--size",
                &a.neighbour_size.to_string(),
                "--threads",
                &a.neighbour_threads.to_string(),
            ])
            .args(["--warmup", "0", "--runs", "1", "--json"])
            .args(["--region", "64M", "--duration", &format!("{seconds:.3}")])
            .arg("--socket")
            .arg(socket)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the neighbour: {e}"))?;
        let mut n = Neighbour { child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = n.child.as_mut().expect("started");
            if let Some(st) = c.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("the neighbour stopped early ({st})"));
            }
            let read = ctl.status().map_err(|e| e.to_string())?.bytes_read;
            if read.saturating_sub(before) > 256 << 20 {
                return Ok(n);
            }
            if Instant::now() > deadline {
                return Err("the neighbour did not start reading within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for it to end (it removes its files); its bandwidth (MiB/s).
    pub(super) fn finish(mut self) -> Result<f64, String> {
        let child = self.child.take().expect("started");
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "the neighbour failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|v| v.get("mib_s").and_then(|m| m.as_f64()))
            .ok_or_else(|| format!("the neighbour reported no bandwidth: {text}"))
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
