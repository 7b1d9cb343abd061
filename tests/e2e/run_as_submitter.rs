//! `cairn run --run-as-submitter`: each task's commands run as the user who submitted it, who
//! cannot touch another submitter's task; a daemon that cannot switch users refuses to start.

use crate::common::*;

#[test]
fn a_daemon_that_cannot_switch_users_refuses_to_start_and_says_what_it_needs() {
    let queue = TestQueue::new();
    // As root, the capabilities are taken away (setpriv); as anyone else there are none.
    let wrapper: &[&str] = if nix::unistd::geteuid().is_root() {
        &[
            "setpriv",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]
    } else {
        &[]
    };
    if !wrapper.is_empty()
        && require_tool(
            "a_daemon_that_cannot_switch_users_refuses_to_start_and_says_what_it_needs",
            "setpriv",
            "util-linux",
        )
        .is_none()
    {
        return;
    }
    let mut daemon = queue.start_wrapped(wrapper, &["--run-as-submitter"]);
    let status = daemon.wait_exit(std::time::Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{}", daemon.stderr());
    let stderr = daemon.stderr();
    for needed in ["CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL"] {
        assert!(stderr.contains(needed), "{needed} is not named: {stderr}");
    }
    assert!(
        queue.list("tasks").is_empty(),
        "it worked on the queue before refusing"
    );
}
