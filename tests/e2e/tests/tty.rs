//! Terminals through CRI, as `kubectl exec -it` and `kubectl attach -it` / `kubectl run -it` use
//! them: CRI's streaming server over WebSocket, a tty exec and a tty container, the window size
//! (ResizePty), input, output and exit codes; and a streaming exec without a terminal. The exec scenario runs on both handlers: corral must
//! behave as containerd's own shim does.

use std::time::Duration;

use anyhow::{bail, Result};
use corral_rig::cri::{container_config, log_dir, pod_config, wait_for_text};
use corral_rig::stream::Session;
use corral_rig::{Options, Rig};

const T: Duration = Duration::from_secs(10);

/// Sets the window to `width` x `height` and checks `stty size` inside sees it. Resize and input
/// travel on separate channels that containerd serves independently, so the check is repeated
/// until the size has arrived.
async fn resize_and_check(s: &mut Session, width: u16, height: u16, round: &mut u32) -> Result<()> {
    s.resize(width, height).await?;
    for _ in 0..20 {
        *round += 1;
        // The shell computes the marker, so the echo of the typed line never matches it.
        s.stdin(format!("stty size; echo R$(({} + 1))\n", *round * 10).as_bytes()).await?;
        let out = s.read_until(&format!("R{}", *round * 10 + 1), T).await?;
        let before = &out[..out.rfind(&format!("R{}", *round * 10 + 1)).unwrap()];
        if before.lines().rev().any(|l| l.trim() == format!("{height} {width}")) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("stty never showed {height} {width}: {:?}", String::from_utf8_lossy(&s.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_with_a_tty_resizes_and_returns_the_exit_code_like_the_runc_shim() -> Result<()> {
    let rig = Rig::start(Options { pause_image: true, ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    for handler in ["corral", "runc"] {
        let name = format!("tty-exec-{handler}");
        let cfg = rig.pod_config(&name);
        let pod = cri.run_pod(&cfg, handler).await?;
        let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;

        let url = cri.exec(&c, &["sh"], true, true).await?;
        let mut s = Session::connect(&url).await?;
        let mut round = 0;
        resize_and_check(&mut s, 100, 40, &mut round).await?;
        resize_and_check(&mut s, 132, 43, &mut round).await?;
        // A real terminal: the shell's stdin is a pty, and what is typed is echoed.
        s.stdin(b"tty; exit 7\n").await?;
        let out = s.read_until("/dev/pts/", T).await?;
        assert!(out.contains("tty; exit 7"), "{handler}: the terminal echoes input: {out:?}");
        assert_eq!(s.finish(T).await?, 7, "{handler}: exit code of the tty exec");
        assert!(s.stderr.is_empty(), "{handler}: a terminal has no stderr");

        // Streaming exec without a terminal (`kubectl exec -i`): stdin in, stdout and stderr apart.
        let url = cri
            .exec(&c, &["sh", "-c", "read line; echo got-$line; echo err-$line >&2; exit 4"], false, true)
            .await?;
        let mut s = Session::connect(&url).await?;
        s.stdin(b"abc\n").await?;
        assert_eq!(s.finish(T).await?, 4, "{handler}: exit code of the streaming exec");
        assert_eq!(String::from_utf8_lossy(&s.stdout), "got-abc\n", "{handler}");
        assert_eq!(String::from_utf8_lossy(&s.stderr), "err-abc\n", "{handler}");

        // The container is untouched and serves more execs.
        let (code, _, _) = cri.exec_sync(&c, &["true"]).await?;
        assert_eq!(code, 0, "{handler}");
        cri.stop_and_remove_pod(&pod).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_to_a_tty_container_types_into_its_shell_and_logs_its_output() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let dir = log_dir(&rig.dir, "tty-attach");
    let cfg = pod_config("tty-attach", &dir);
    let pod = cri.run_pod(&cfg, "corral").await?;
    // What `kubectl run -it --image=busybox -- sh` creates: stdin open, a tty, an interactive shell.
    let mut config = container_config("shell", "");
    config.command = vec!["/bin/sh".into()];
    config.args = vec![];
    config.stdin = true;
    config.tty = true;
    let c = cri.run_container(&pod, &cfg, &config).await?;

    let url = cri.attach(&c, true).await?;
    let mut s = Session::connect(&url).await?;
    let mut round = 0;
    resize_and_check(&mut s, 90, 30, &mut round).await?;
    s.stdin(b"echo attached-$((6 * 7)); tty\n").await?;
    let out = s.read_until("/dev/pts/", T).await?;
    assert!(out.contains("attached-42"), "{out:?}");
    // The terminal's output also reaches the container log, as stdout.
    let log = wait_for_text(&dir.join("shell.log"), "attached-42", T).await?;
    assert!(log.lines().any(|l| l.contains(" stdout ") && l.contains("attached-42")), "{log}");

    // The shell's exit ends the container with its code.
    s.stdin(b"exit 3\n").await?;
    assert_eq!(cri.wait_exited(&c, T).await?, 3);
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}
