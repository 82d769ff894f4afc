//! `flowd`: the runtime daemon.

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(command), config) = (args.next(), args.collect::<Vec<_>>()) else {
        eprintln!("usage: flowd check-config [--config flowd.toml]");
        return std::process::ExitCode::from(2);
    };
    let path = match config.as_slice() {
        [] => "flowd.toml".to_string(),
        [flag, path] if flag == "--config" => path.clone(),
        _ => {
            eprintln!("usage: flowd {command} [--config flowd.toml]");
            return std::process::ExitCode::from(2);
        }
    };
    if command != "check-config" {
        eprintln!("flowd: unknown command `{command}`; the commands are: check-config");
        return std::process::ExitCode::from(2);
    }
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("flowd: cannot read {path}: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    match flow_daemon::config::load(&path, &text, &|name| std::env::var(name).ok()) {
        Ok(config) => {
            println!(
                "{path}: ok ({} accounts, listening on {}, store {})",
                config.accounts.len(),
                config.listen,
                config.store
            );
            std::process::ExitCode::SUCCESS
        }
        Err(problems) => {
            for problem in &problems {
                eprintln!("error: {problem}");
            }
            std::process::ExitCode::from(2)
        }
    }
}
