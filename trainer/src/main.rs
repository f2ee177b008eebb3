//! The `titan-rs` binary: logging set up, the command line parsed and run ([`cli`]).

mod cli;

use clap::Parser;
use std::process::ExitCode;

#[global_allocator]
static ALLOC: titan_rs::alloc::Counting = titan_rs::alloc::Counting;

/// The log filter without `RUST_LOG`: our own messages at `info`; pliron (the CUDA compiler's IR
/// framework) logs every kernel's IR after every pass at `info` (1.9 million lines for the 46
/// kernels of `titan-rs ptx`), so it only gets warnings.
const DEFAULT_LOG: &str = "info,pliron=warn";

fn main() -> ExitCode {
    titan_rs::alloc::keep_freed_memory();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(titan_rs::metrics::console::stderr_color())
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_LOG.into()))
        .with_target(false)
        .init();
    match cli::run(cli::args::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
