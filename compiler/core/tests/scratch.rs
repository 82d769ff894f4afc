#[test]
fn scratch() {
    for f in std::env::var("FLOW_SCRATCH")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
    {
        let src = std::fs::read_to_string(f).unwrap();
        let checked = flow_compiler::check_source(f, &src);
        println!("{f}:");
        for p in &checked.diagnostics {
            let (l, c) = flow_compiler::diagnostic::line_col(&src, p.primary.span.start);
            println!(
                "  {l}:{c} {} {}  [{}] {:?}",
                p.code.as_str(),
                p.message,
                p.primary.message,
                p.hints
            );
        }
    }
}
