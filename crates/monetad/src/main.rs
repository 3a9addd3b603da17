//! The `monetad` binary.

use clap::Parser;

fn main() {
    let args = monetad::Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: `moneta start` sends the log to a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match monetad::Config::resolve(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("monetad: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = monetad::run(config) {
        eprintln!("monetad: {e}");
        std::process::exit(1);
    }
}
