//! A CRI client over containerd's unix socket, with the calls and configs kubelet uses.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use tonic::transport::{Channel, Endpoint, Uri};

/// A CRI error as "<RPC>: <containerd's message>".
fn failed(rpc: &'static str) -> impl Fn(tonic::Status) -> anyhow::Error {
    move |s| anyhow!("{rpc}: {}", s.message())
}

#[derive(Clone)]
pub struct Cri {
    pub runtime: RuntimeServiceClient<Channel>,
    pub images: ImageServiceClient<Channel>,
}

impl Cri {
    pub async fn connect(socket: &Path) -> Result<Cri> {
        let socket = socket.to_path_buf();
        let channel = Endpoint::try_from("http://[::]:50051")?
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?))
                }
            }))
            .await?;
        Ok(Cri {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        })
    }

    /// RuntimeReady and NetworkReady both true.
    pub async fn ready(&mut self) -> Result<bool> {
        let status = self.runtime.status(StatusRequest { verbose: false }).await?.into_inner();
        let conds = status.status.map(|s| s.conditions).unwrap_or_default();
        Ok(["RuntimeReady", "NetworkReady"].iter().all(|t| conds.iter().any(|c| c.r#type == *t && c.status)))
    }

    pub async fn image_names(&mut self) -> Result<Vec<String>> {
        let images = self.images.list_images(ListImagesRequest { filter: None }).await?.into_inner().images;
        Ok(images.into_iter().flat_map(|i| i.repo_tags).collect())
    }

    pub async fn run_pod(&mut self, config: &PodSandboxConfig, handler: &str) -> Result<String> {
        let resp = self
            .runtime
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .map_err(failed("RunPodSandbox"))?;
        Ok(resp.into_inner().pod_sandbox_id)
    }

    pub async fn pod_status(&mut self, id: &str) -> Result<PodSandboxStatusResponse> {
        Ok(self
            .runtime
            .pod_sandbox_status(PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: true })
            .await
            .map_err(failed("PodSandboxStatus"))?
            .into_inner())
    }

    pub async fn pod_ready(&mut self, id: &str) -> Result<bool> {
        let status = self.pod_status(id).await?;
        Ok(status.status.map(|s| s.state) == Some(PodSandboxState::SandboxReady as i32))
    }

    /// Polls PodSandboxStatus until the pod is NOTREADY, failing after `timeout` (a bound that
    /// keeps a broken run from hanging, not a timing claim). Right after a shim dies a status
    /// call may fail while the connection closes: that counts as not yet.
    pub async fn wait_not_ready(&mut self, id: &str, timeout: Duration) -> Result<Duration> {
        let started = Instant::now();
        while self.pod_ready(id).await.unwrap_or(true) {
            anyhow::ensure!(started.elapsed() < timeout, "pod {id} still READY after {timeout:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(started.elapsed())
    }

    /// CreateContainer + StartContainer; returns the container id.
    pub async fn run_container(
        &mut self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: &ContainerConfig,
    ) -> Result<String> {
        let id = self.create_container(pod, pod_config, config).await?;
        self.start_container(&id).await?;
        Ok(id)
    }

    pub async fn create_container(
        &mut self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: &ContainerConfig,
    ) -> Result<String> {
        Ok(self
            .runtime
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config.clone()),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .map_err(failed("CreateContainer"))?
            .into_inner()
            .container_id)
    }

    pub async fn start_container(&mut self, id: &str) -> Result<()> {
        self.runtime
            .start_container(StartContainerRequest { container_id: id.into() })
            .await
            .map_err(failed("StartContainer"))?;
        Ok(())
    }

    pub async fn container_status(&mut self, id: &str) -> Result<ContainerStatusResponse> {
        Ok(self
            .runtime
            .container_status(ContainerStatusRequest { container_id: id.into(), verbose: true })
            .await
            .map_err(failed("ContainerStatus"))?
            .into_inner())
    }

    /// The task pid CRI recorded for a container (from its verbose info).
    pub async fn container_pid(&mut self, id: &str) -> Result<u32> {
        let status = self.container_status(id).await?;
        let info = status.info.get("info").context("no verbose info")?;
        let v: serde_json::Value = serde_json::from_str(info)?;
        v["pid"].as_u64().map(|p| p as u32).context("no pid in verbose info")
    }

    /// Waits until the container has exited; returns its exit code.
    pub async fn wait_exited(&mut self, id: &str, timeout: Duration) -> Result<i32> {
        let timeout = crate::scaled(timeout);
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.container_status(id).await?.status.context("no status")?;
            if s.state == ContainerState::ContainerExited as i32 {
                return Ok(s.exit_code);
            }
            if Instant::now() > deadline {
                bail!("container {id} still in state {} after {timeout:?}", s.state);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// ExecSync: (exit code, stdout, stderr).
    pub async fn exec_sync(&mut self, id: &str, cmd: &[&str]) -> Result<(i32, String, String)> {
        let resp = self
            .runtime
            .exec_sync(ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout: 10,
            })
            .await
            .map_err(|s| anyhow!("ExecSync {cmd:?}: {}", s.message()))?
            .into_inner();
        Ok((
            resp.exit_code,
            String::from_utf8_lossy(&resp.stdout).into_owned(),
            String::from_utf8_lossy(&resp.stderr).into_owned(),
        ))
    }

    /// Exec: the streaming URL for `cmd`, with a terminal or not; stdout always, stdin and stderr
    /// as asked (a terminal has no stderr).
    pub async fn exec(&mut self, id: &str, cmd: &[&str], tty: bool, stdin: bool) -> Result<String> {
        let resp = self
            .runtime
            .exec(ExecRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                tty,
                stdin,
                stdout: true,
                stderr: !tty,
            })
            .await
            .map_err(failed("Exec"))?;
        Ok(resp.into_inner().url)
    }

    /// Attach: the streaming URL for the container's own stdio.
    pub async fn attach(&mut self, id: &str, tty: bool) -> Result<String> {
        let resp = self
            .runtime
            .attach(AttachRequest { container_id: id.into(), stdin: true, tty, stdout: true, stderr: !tty })
            .await
            .map_err(failed("Attach"))?;
        Ok(resp.into_inner().url)
    }

    pub async fn stop_container(&mut self, id: &str) -> Result<()> {
        self.runtime
            .stop_container(StopContainerRequest { container_id: id.into(), timeout: 2 })
            .await
            .map_err(failed("StopContainer"))?;
        Ok(())
    }

    pub async fn remove_container(&mut self, id: &str) -> Result<()> {
        self.runtime
            .remove_container(RemoveContainerRequest { container_id: id.into() })
            .await
            .map_err(failed("RemoveContainer"))?;
        Ok(())
    }

    pub async fn stop_pod(&mut self, id: &str) -> Result<()> {
        self.runtime
            .stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: id.into() })
            .await
            .map_err(failed("StopPodSandbox"))?;
        Ok(())
    }

    pub async fn remove_pod(&mut self, id: &str) -> Result<()> {
        self.runtime
            .remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id.into() })
            .await
            .map_err(failed("RemovePodSandbox"))?;
        Ok(())
    }

    /// StopPodSandbox then RemovePodSandbox, as kubelet does when a pod is deleted.
    pub async fn stop_and_remove_pod(&mut self, id: &str) -> Result<()> {
        self.stop_pod(id).await?;
        self.remove_pod(id).await
    }
}

/// A pod config as kubelet sends it: pid mode CONTAINER, net and ipc POD, a log directory.
pub fn pod_config(name: &str, log_dir: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}-{}", std::process::id()),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.display().to_string(),
        labels: HashMap::from([("app".to_string(), name.to_string())]),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Pod as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A busybox container running `sh -c script`, logging to `<pod log dir>/<name>.log`.
pub fn container_config(name: &str, script: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(ImageSpec { image: crate::BUSYBOX.into(), ..Default::default() }),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Pod as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The namespace options of a pod config made by [`pod_config`].
pub fn pod_ns(config: &mut PodSandboxConfig) -> &mut NamespaceOption {
    let linux = config.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    sc.namespace_options.get_or_insert_with(Default::default)
}

/// The namespace options of a container config made by [`container_config`].
pub fn container_ns(config: &mut ContainerConfig) -> &mut NamespaceOption {
    let linux = config.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    sc.namespace_options.get_or_insert_with(Default::default)
}

/// Waits until `path` contains `needle`; returns the file's text.
pub async fn wait_for_text(path: &Path, needle: &str, timeout: Duration) -> Result<String> {
    let timeout = crate::scaled(timeout);
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            bail!("{} does not contain {needle:?} after {timeout:?}; it has: {text:?}", path.display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fresh per-test log directory for pods.
pub fn log_dir(rig_dir: &Path, pod: &str) -> PathBuf {
    let dir = rig_dir.join("logs").join(pod);
    std::fs::create_dir_all(&dir).expect("create log dir");
    dir
}
