//! Exec through CRI (ExecSync, what kubelet's exec probes and `kubectl exec` without a tty use):
//! output, exit codes, and that the exec runs in the container's (and so the pod's) namespaces.

use anyhow::Result;
use corral_rig::cri::container_config;
use corral_rig::{Options, Rig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_sync_returns_output_and_exit_codes_inside_the_pod() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("execs");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;

    let (code, out, _) = cri.exec_sync(&c, &["cat", "/etc/hostname"]).await?;
    assert_eq!((code, out.as_str()), (0, "execs\n"));
    let (code, out, err) = cri.exec_sync(&c, &["sh", "-c", "echo out; echo err >&2; exit 5"]).await?;
    assert_eq!((code, out.as_str(), err.as_str()), (5, "out\n", "err\n"));
    // The exec sees the container's pid namespace: its init is pid 1 running sleep.
    let (_, out, _) = cri.exec_sync(&c, &["cat", "/proc/1/cmdline"]).await?;
    assert_eq!(out, "sleep\u{0}1000\u{0}");
    // A missing binary is an error of the exec, not of the container.
    match cri.exec_sync(&c, &["/no/such/binary"]).await {
        Ok((code, _, _)) => assert_ne!(code, 0),
        // runc: `stat /no/such/binary: no such file or directory`; the builtin runtime:
        // `executable '/no/such/binary' not found in $PATH`.
        Err(e) => assert!(e.to_string().contains("/no/such/binary"), "{e}"),
    }
    assert!(cri.pod_ready(&pod).await?);
    let (code, _, _) = cri.exec_sync(&c, &["true"]).await?;
    assert_eq!(code, 0, "the container still serves execs");

    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}
