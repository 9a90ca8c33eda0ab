//! MySQL benchmark (to come).

fn main() {}
