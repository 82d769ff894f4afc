struct Disk;
impl flow_compiler::SourceLoader for Disk {
    fn load(&self, path: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| e.to_string())
    }
}
#[test]
fn scratch() {
    for f in std::env::var("FLOW_SCRATCH").unwrap_or_default().split(',').filter(|s| !s.is_empty()) {
        let checked = flow_compiler::check(f, &Disk).unwrap();
        println!("{f}:");
        for p in &checked.diagnostics {
            let src = &checked.file(p.primary.file).text;
            let (l, c) = flow_compiler::diagnostic::line_col(src, p.primary.span.start);
            println!("  {}:{l}:{c} {} {}  [{}] {:?}", checked.file(p.primary.file).path, p.code.as_str(), p.message, p.primary.message, p.hints);
        }
    }
}
