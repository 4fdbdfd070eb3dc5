//! The binary's dashboard flag: `serve --ui` serves `/ui` with a warning;
//! without it there is none. The dashboard itself is tested in process by
//! `waypost-registrar-server` (`registrar-server/tests/it/ui.rs`, `ui_browser.rs`).

use crate::common;

/// The binary: `serve --ui` serves the page and warns that it is open to
/// anyone; without the flag there is no `/ui`.
#[tokio::test]
async fn serve_ui_turns_it_on_with_a_warning() {
    let with = common::spawn_serve(&["--ui"]).await;
    let (code, body) = common::http_get(&with.health, "/ui").await;
    assert_eq!(code, 200, "{}", with.stderr());
    assert!(body.contains("<title>Registrar</title>"), "{body}");
    let log = with.stderr();
    assert!(
        log.contains("/ui") && log.contains("no authentication"),
        "{log}"
    );
    let without = common::spawn_serve(&[]).await;
    let (code, _) = common::http_get(&without.health, "/ui").await;
    assert_eq!(code, 404);
    assert!(!without.stderr().contains("no authentication"));
}
