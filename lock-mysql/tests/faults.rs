//! MySQL fault tests (to come).

fn main() {}
