//! TLS on the single Redis: a second port that speaks only TLS, with a certificate authority
//! and a server certificate (for `127.0.0.1` and `localhost`) generated once with `openssl`
//! under `<dir>/tls/`. The tests of `rediss://` trust that authority through the URL's
//! `ca_file`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use super::Instance;
use super::install::Tools;
use super::process;

/// The certificate authority's certificate, which clients trust (`ca_file`), relative to the
/// instance's directory.
pub(super) const CA_FILE: &str = "tls/ca.pem";

/// `<dir>/tls`, where the certificates live.
fn dir(inst: &Instance) -> PathBuf {
    inst.dir.join("tls")
}

/// The `redis-server` options that open `port` for TLS (clients need no certificate).
pub(super) fn args(inst: &Instance, port: u16) -> Vec<String> {
    let tls = dir(inst);
    let file = |name: &str| tls.join(name).display().to_string();
    [
        ("tls-port", port.to_string()),
        ("tls-cert-file", file("server.pem")),
        ("tls-key-file", file("server.key")),
        ("tls-ca-cert-file", file("ca.pem")),
        ("tls-auth-clients", "no".to_string()),
    ]
    .into_iter()
    .flat_map(|(key, value)| [format!("--{key}"), value])
    .collect()
}

/// Generates the authority and the server's certificate unless both are there.
pub(super) fn ensure_certificates(tools: &Tools, inst: &Instance) -> Result<()> {
    let tls = dir(inst);
    if ["ca.pem", "server.pem", "server.key"]
        .iter()
        .all(|name| tls.join(name).is_file())
    {
        return Ok(());
    }
    process::ensure_dir(&tls)?;
    std::fs::write(
        tls.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
         extendedKeyUsage=serverAuth\n\
         keyUsage=digitalSignature,keyEncipherment\n",
    )?;
    let log = tls.join("openssl.log");
    let openssl = tools.openssl.display().to_string();
    let path = |name: &str| tls.join(name).display().to_string();
    let steps: [Vec<String>; 3] = [
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-subj",
            "/CN=lock test CA",
            "-keyout",
        ]
        .map(String::from)
        .into_iter()
        .chain([path("ca.key"), "-out".into(), path("ca.pem")])
        .collect(),
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
        ]
        .map(String::from)
        .into_iter()
        .chain([path("server.key"), "-out".into(), path("server.csr")])
        .collect(),
        ["x509", "-req", "-days", "3650", "-CAcreateserial", "-in"]
            .map(String::from)
            .into_iter()
            .chain([
                path("server.csr"),
                "-CA".into(),
                path("ca.pem"),
                "-CAkey".into(),
                path("ca.key"),
                "-extfile".into(),
                path("server.ext"),
                "-out".into(),
                path("server.pem"),
            ])
            .collect(),
    ];
    for step in steps {
        let mut argv = vec![openssl.clone()];
        argv.extend(step);
        process::run_logged(&argv, &log, Duration::from_secs(60))?;
    }
    Ok(())
}
