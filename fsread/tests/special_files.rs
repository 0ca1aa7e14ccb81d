//! The class "special files" through the one reader: each kind is refused at once (a
//! FIFO never blocks, `/dev/zero` is never read, a huge file is never read), with an
//! error naming the file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use marin3r_fsread::{Error, read_regular_file};
use marin3r_testkit::special_files::Special;

#[test]
fn every_special_kind_is_refused_at_once_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for kind in Special::ALL {
        let path = dir.path().join("tls.crt");
        kind.make(&path);
        // On a thread: a blocking open of the FIFO would hang the test, not fail it.
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || tx.send(read_regular_file(&p, 1024 * 1024)));
        let result = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{kind:?}: the read blocked"));
        let e: Error = result.expect_err(&format!("{kind:?} was read"));
        let text = e.to_string();
        assert!(text.contains(&*path.to_string_lossy()), "{kind:?}: {text}");
        let full = format!("{text}: {}", e.reason());
        assert!(full.contains(kind.expected_error()), "{kind:?}: {full}");
        if kind == Special::Huge {
            assert!(text.contains("1048576-byte limit"), "{text}");
        }
    }
}
