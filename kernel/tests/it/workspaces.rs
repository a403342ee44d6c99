//! Workspaces: rows, ownership, files under /workspaces/<id>.

use serde_json::json;

use crate::harness::{TestKernel, err_of};

#[tokio::test]
async fn a_workspace_is_created_listed_read_and_archived_by_its_owner() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let d = a
        .call("sys.workspace.create", json!({"label": "demo"}))
        .await
        .unwrap();
    let w = &d["workspace"];
    let id = w["workspaceId"].as_str().unwrap().to_owned();
    assert!(id.starts_with("ws_"));
    assert_eq!(
        (w["ownerUid"].clone(), w["state"].clone()),
        (json!(1000), json!("active"))
    );
    assert_eq!(w["label"], "demo");
    let list = a.call("sys.workspace.list", json!({})).await.unwrap();
    assert_eq!(list["workspaces"].as_array().unwrap().len(), 1);
    let path = format!("/workspaces/{id}/hello.txt");
    a.call("fs.write", json!({"path": path, "content": "hi\n"}))
        .await
        .unwrap();
    let r = a.call("fs.read", json!({"path": path})).await.unwrap();
    assert_eq!(r["content"], "1\thi");
    let dir = a
        .call("fs.read", json!({"path": "/workspaces"}))
        .await
        .unwrap();
    assert_eq!(dir["directories"], json!([id]));
    let d = a
        .call("sys.workspace.archive", json!({"workspaceId": id}))
        .await
        .unwrap();
    assert_eq!(d["workspace"]["state"], "archived");
    let d = a
        .call("fs.write", json!({"path": path, "content": "x"}))
        .await
        .unwrap();
    assert!(d["error"].as_str().unwrap().contains("archived"), "{d}");
    let r = a.call("fs.read", json!({"path": path})).await.unwrap();
    assert_eq!(r["ok"], true, "archived workspaces stay readable");
}

#[tokio::test]
async fn a_second_user_cannot_see_or_touch_the_first_users_workspace() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let d = a.call("sys.workspace.create", json!({})).await.unwrap();
    let id = d["workspace"]["workspaceId"].as_str().unwrap().to_owned();
    a.call(
        "fs.write",
        json!({"path": format!("/workspaces/{id}/f"), "content": "x"}),
    )
    .await
    .unwrap();
    let mut b = k.bob().await;
    let d = b
        .call("fs.read", json!({"path": format!("/workspaces/{id}/f")}))
        .await
        .unwrap();
    assert!(
        d["error"].as_str().unwrap().contains("Permission denied"),
        "{d}"
    );
    let d = b
        .call(
            "fs.write",
            json!({"path": format!("/workspaces/{id}/g"), "content": "x"}),
        )
        .await
        .unwrap();
    assert_eq!(d["ok"], false);
    let g = b
        .call("sys.workspace.get", json!({"workspaceId": id}))
        .await
        .unwrap();
    assert_eq!(g["workspace"], json!(null));
    let f = b
        .request("sys.workspace.archive", json!({"workspaceId": id}))
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403);
    let f = b
        .request("sys.workspace.list", json!({"uid": 1000}))
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403);
    let l = b.call("sys.workspace.list", json!({})).await.unwrap();
    assert_eq!(l["workspaces"], json!([]));
    let dir = b
        .call("fs.read", json!({"path": "/workspaces"}))
        .await
        .unwrap();
    assert_eq!(dir["directories"], json!([]));
    let f = b
        .request(
            "sys.workspace.create",
            json!({"backend": {"kind": "remote", "address": "127.0.0.1:1", "tokenFile": "/etc/shadow"}}),
        )
        .await
        .unwrap();
    assert_eq!(
        err_of(&f).0,
        403,
        "only root names files for the kernel to read"
    );
}

#[tokio::test]
async fn a_workspace_that_does_not_exist_is_not_found_and_anothers_is_still_refused() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = crate::harness::new_workspace(&mut a).await;
    let f = a
        .request(
            "sys.workspace.archive",
            json!({"workspaceId": "ws_000000000000000000000000"}),
        )
        .await
        .unwrap();
    let (code, msg) = err_of(&f);
    assert_eq!(
        (code, msg.as_str()),
        (404, "Workspace not found: ws_000000000000000000000000")
    );
    let f = a
        .request(
            "shell.exec",
            json!({"cwd": "/workspaces/ws_000000000000000000000000", "input": "true"}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 404);
    let mut b = k.bob().await;
    let f = b
        .request("sys.workspace.archive", json!({"workspaceId": id}))
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403, "someone else's is refused, as before");
}
