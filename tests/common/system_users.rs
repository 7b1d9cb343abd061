//! Throwaway system users for tests that need several real users (root only): a group and its
//! members, created with `groupadd`/`useradd` under names unique to the test run, and removed
//! again when the [`SystemUsers`] is dropped, whether the test passed or panicked.

use std::process::Command;

/// One user of a [`SystemUsers`] group.
#[derive(Debug, Clone)]
pub(crate) struct SystemUser {
    pub name: String,
    pub uid: u32,
}

/// A group and its members (and any other groups made with [`SystemUsers::add_group`]),
/// removed on drop.
#[derive(Debug)]
pub(crate) struct SystemUsers {
    pub group: String,
    pub gid: u32,
    pub users: Vec<SystemUser>,
    tag: String,
    other_groups: Vec<String>,
}

impl SystemUsers {
    /// Create a group and one user per entry of `members`, each with that group as its
    /// primary group, no home directory and `/bin/sh` as shell. Names are `ct<random>` and the
    /// member's letter (short: login names are at most 32 bytes). Panics naming the command
    /// that failed; whatever was created before is removed.
    pub(crate) fn create(members: &[&str]) -> SystemUsers {
        let tag = format!("ct{:08x}", fastrand::u32(..));
        let group = format!("{tag}g");
        run(Command::new("groupadd").arg(&group));
        let gid = nix::unistd::Group::from_name(&group)
            .expect("looking up the new group")
            .expect("the new group exists")
            .gid
            .as_raw();
        let mut created = SystemUsers {
            group: group.clone(),
            gid,
            users: Vec::new(),
            tag: tag.clone(),
            other_groups: Vec::new(),
        };
        for member in members {
            let name = format!("{tag}{member}");
            run(Command::new("useradd")
                .args(["--no-create-home", "--no-user-group", "--gid", &group])
                .args(["--home-dir", "/nonexistent", "--shell", "/bin/sh"])
                .arg(&name));
            let uid = nix::unistd::User::from_name(&name)
                .expect("looking up the new user")
                .expect("the new user exists")
                .uid
                .as_raw();
            created.users.push(SystemUser { name, uid });
        }
        created
    }
}

impl SystemUsers {
    /// Another group (`<tag><suffix>`), with `members` added to it as a supplementary group;
    /// returns its name and gid.
    pub(crate) fn add_group(&mut self, suffix: &str, members: &[&SystemUser]) -> (String, u32) {
        let name = format!("{}{suffix}", self.tag);
        run(Command::new("groupadd").arg(&name));
        self.other_groups.push(name.clone());
        for member in members {
            run(Command::new("usermod").args(["--append", "--groups", &name, &member.name]));
        }
        let gid = nix::unistd::Group::from_name(&name)
            .expect("looking up the new group")
            .expect("the new group exists")
            .gid
            .as_raw();
        (name, gid)
    }
}

impl Drop for SystemUsers {
    fn drop(&mut self) {
        for user in &self.users {
            let _ = Command::new("userdel").arg(&user.name).status();
        }
        for group in &self.other_groups {
            let _ = Command::new("groupdel").arg(group).status();
        }
        let _ = Command::new("groupdel").arg(&self.group).status();
    }
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .expect("starting a user-management command");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
