//! `corral-oci`: corral's builtin OCI runtime (`runtime.binary = "builtin"`).
//!
//! It speaks the part of runc's command line that corral uses (see `args`), so corral's runtime
//! client drives it exactly as it drives runc: one short-lived process per operation, the
//! container's stdio as fds 0-2 of `create` and `exec`, a pid file, runc's JSON log lines. The
//! work is done by youki's `libcontainer`, which needs no second process image: where runc
//! starts a Go runtime and then re-executes itself as `runc init`, this process clones the
//! container's init directly.
//!
//! Errors end the process with status 1 after one JSON line `{"level":"error","msg":...}` on
//! the log (the `--log` file, else stderr), the line corral quotes in its own error.

mod args;
mod exec;
mod features;
mod log;
mod ops;
mod spec;

use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // Asked by corral's `doctor` and `-info`, never with other arguments.
    match argv.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["--version"] | ["-v"] => {
            println!("{}", features::version());
            return ExitCode::SUCCESS;
        }
        ["features"] => {
            println!("{}", features::document());
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let args = match args::Args::parse(&argv) {
        Ok(args) => args,
        Err(e) => {
            log::Sink::stderr().error(&format!("corral-oci: {e}"));
            return ExitCode::from(2);
        }
    };
    let sink = log::Sink::open(args.global.log.as_deref());
    sink.install_tracing();
    let bundle = match &args.command {
        args::Command::Create { bundle, .. } => Some(bundle.clone()),
        _ => None,
    };
    match ops::run(&args.global, args.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(mut message) => {
            let first = args.global.log.as_deref().and_then(log::Sink::first_logged_error);
            if let Some(first) = first.filter(|f| !message.contains(f.as_str())) {
                message = format!("{message} (first error: {first})");
            }
            if let Some(bundle) = &bundle {
                message = ops::with_process_context(message, bundle);
            }
            sink.error(&message);
            ExitCode::FAILURE
        }
    }
}
