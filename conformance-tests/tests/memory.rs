//! The conformance suite against the in-memory reference backend.

fn main() -> std::process::ExitCode {
    conformance_tests::Runner::new()
        .store("memory", || async {
            Ok(conformance_tests::MemoryStore::new())
        })
        .main()
}
