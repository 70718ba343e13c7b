//! `containerd-shim-corral-v2`: the front end. Every behaviour lives in the `corral` library.

use std::process::ExitCode;

use corral::shim::args::{Action, Args};
use corral::shim::{delete, server, start};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match Args::parse(&argv) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("containerd-shim-corral-v2: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match args.action {
        Action::Version => {
            println!(
                "containerd-shim-corral-v2 version {} (commit {})",
                env!("CARGO_PKG_VERSION"),
                env!("CORRAL_GIT_COMMIT")
            );
            Ok(())
        }
        Action::Info => corral::shim::info::run(
            env!("CARGO_PKG_VERSION"),
            env!("CORRAL_GIT_COMMIT"),
            &corral::config::get().runtime.program(),
        ),
        Action::Doctor => doctor(&args),
        Action::Start => start::run(&args),
        Action::Delete => delete::run(&args),
        Action::Serve | Action::ServeNode => server::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `start` and `delete` output goes back to containerd, which shows it in its error.
            eprintln!("containerd-shim-corral-v2 {:?}: {e}", args.action);
            ExitCode::FAILURE
        }
    }
}

/// Prints each finding; fails when any is a problem.
fn doctor(args: &Args) -> corral::Result<()> {
    use corral::doctor::Finding;
    let config = args.containerd_config.clone().unwrap_or_else(|| "/etc/containerd/config.toml".into());
    let findings = corral::doctor::run(&config);
    let mut problems = 0;
    for f in &findings {
        match f {
            Finding::Ok(s) => println!("ok       {s}"),
            Finding::Problem { what, fix } => {
                problems += 1;
                println!("PROBLEM  {what}\n         fix: {fix}");
            }
        }
    }
    if problems > 0 {
        return Err(corral::Error::precondition(format!("{problems} problem(s) found")));
    }
    println!("corral can run on this node");
    Ok(())
}
