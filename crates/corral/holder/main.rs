//! corral-holder: the process that holds a pod's namespaces. A `no_std` program with no libc,
//! so it costs a few pages of memory per pod. corral's build script compiles it with rustc and
//! embeds it in the shim, which runs it from a memfd.
//!
//! It reads a spec on stdin (see `src/holder/protocol.rs`), joins and creates the pod's
//! namespaces, sets hostname and sysctls, then confines itself (see [`confine`]: an empty
//! read-only root in a mount namespace of its own, no capabilities, no_new_privs, not dumpable,
//! a seccomp filter), reports `R<pid>` (or the failed step) on stdout, and waits for signals: it
//! reaps orphans (as pid 1 of a pod PID namespace) and exits on SIGTERM/SIGINT.
//! Everything here runs single-threaded.

#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]

#[path = "../src/holder/protocol.rs"]
#[allow(dead_code)]
mod protocol;

use core::arch::{asm, global_asm};

#[cfg(target_arch = "x86_64")]
mod nr {
    pub const READ: usize = 0;
    pub const WRITE: usize = 1;
    pub const CLOSE: usize = 3;
    pub const RT_SIGPROCMASK: usize = 14;
    pub const RT_SIGRETURN: usize = 15;
    pub const IOCTL: usize = 16;
    pub const GETPID: usize = 39;
    pub const CLONE: usize = 56;
    pub const EXIT: usize = 60;
    pub const WAIT4: usize = 61;
    pub const CHDIR: usize = 80;
    pub const CAPSET: usize = 126;
    pub const RT_SIGTIMEDWAIT: usize = 128;
    pub const PIVOT_ROOT: usize = 155;
    pub const PRCTL: usize = 157;
    pub const MOUNT: usize = 165;
    pub const UMOUNT2: usize = 166;
    pub const SETHOSTNAME: usize = 170;
    pub const RESTART_SYSCALL: usize = 219;
    pub const EXIT_GROUP: usize = 231;
    pub const OPENAT: usize = 257;
    pub const UNSHARE: usize = 272;
    pub const DUP3: usize = 292;
    pub const SETNS: usize = 308;
    pub const SECCOMP: usize = 317;
    pub const CLOSE_RANGE: usize = 436;
    /// AUDIT_ARCH_X86_64, what seccomp sees as this architecture.
    pub const AUDIT_ARCH: u32 = 0xc000_003e;
}

#[cfg(target_arch = "aarch64")]
mod nr {
    pub const DUP3: usize = 24;
    pub const IOCTL: usize = 29;
    pub const UMOUNT2: usize = 39;
    pub const MOUNT: usize = 40;
    pub const PIVOT_ROOT: usize = 41;
    pub const CHDIR: usize = 49;
    pub const OPENAT: usize = 56;
    pub const CLOSE: usize = 57;
    pub const READ: usize = 63;
    pub const WRITE: usize = 64;
    pub const CAPSET: usize = 91;
    pub const EXIT: usize = 93;
    pub const EXIT_GROUP: usize = 94;
    pub const UNSHARE: usize = 97;
    pub const RESTART_SYSCALL: usize = 128;
    pub const RT_SIGPROCMASK: usize = 135;
    pub const RT_SIGTIMEDWAIT: usize = 137;
    pub const RT_SIGRETURN: usize = 139;
    pub const SETHOSTNAME: usize = 161;
    pub const PRCTL: usize = 167;
    pub const GETPID: usize = 172;
    pub const CLONE: usize = 220;
    pub const WAIT4: usize = 260;
    pub const SETNS: usize = 268;
    pub const SECCOMP: usize = 277;
    pub const CLOSE_RANGE: usize = 436;
    /// AUDIT_ARCH_AARCH64, what seccomp sees as this architecture.
    pub const AUDIT_ARCH: u32 = 0xc000_00b7;
}

#[cfg(target_arch = "x86_64")]
global_asm!(".globl _start", "_start:", "xor ebp, ebp", "and rsp, -16", "call holder_main", "ud2");
#[cfg(target_arch = "aarch64")]
global_asm!(".globl _start", "_start:", "mov x29, #0", "bl holder_main", "brk #0");

/// A raw system call with up to five arguments; returns the kernel's value (negative errno).
#[cfg(target_arch = "x86_64")]
fn syscall(n: usize, a: [usize; 5]) -> isize {
    let ret: isize;
    // SAFETY: the Linux x86_64 syscall ABI; every caller passes arguments valid for `n`
    // (pointers into live buffers of the stated length).
    unsafe {
        asm!("syscall", inlateout("rax") n as isize => ret, in("rdi") a[0], in("rsi") a[1],
             in("rdx") a[2], in("r10") a[3], in("r8") a[4], lateout("rcx") _, lateout("r11") _,
             options(nostack));
    }
    ret
}

#[cfg(target_arch = "aarch64")]
fn syscall(n: usize, a: [usize; 5]) -> isize {
    let ret: isize;
    // SAFETY: the Linux aarch64 syscall ABI; every caller passes arguments valid for `n`.
    unsafe {
        asm!("svc 0", in("x8") n, inlateout("x0") a[0] as isize => ret, in("x1") a[1],
             in("x2") a[2], in("x3") a[3], in("x4") a[4], options(nostack));
    }
    ret
}

const AT_FDCWD: isize = -100;
const O_RDONLY: usize = 0;
const O_WRONLY: usize = 1;
const O_RDWR: usize = 2;
const O_CLOEXEC: usize = 0o2000000;
const CLONE_NEWIPC: usize = 0x0800_0000;
const CLONE_NEWUTS: usize = 0x0400_0000;
const CLONE_NEWPID: usize = 0x2000_0000;
const CLONE_NEWNET: usize = 0x4000_0000;
const CLONE_NEWUSER: usize = 0x1000_0000;
const CLONE_NEWNS: usize = 0x0002_0000;
const MS_RDONLY: usize = 1;
const MS_NOSUID: usize = 2;
const MS_NODEV: usize = 4;
const MS_NOEXEC: usize = 8;
const MS_REC: usize = 0x4000;
const MS_PRIVATE: usize = 1 << 18;
const MNT_DETACH: usize = 2;
const PR_SET_DUMPABLE: usize = 4;
const PR_SET_NAME: usize = 15;
const PR_CAPBSET_DROP: usize = 24;
const PR_SET_NO_NEW_PRIVS: usize = 38;
const PR_CAP_AMBIENT: usize = 47;
const PR_CAP_AMBIENT_CLEAR_ALL: usize = 4;
const SIGCHLD: usize = 17;
const WNOHANG: usize = 1;
const NS_GET_USERNS: usize = 0xb701;
/// SIGINT(2), SIGTERM(15), SIGCHLD(17) as a kernel sigset.
const WAITED: u64 = (1 << 1) | (1 << 14) | (1 << 16);

/// Opens a path given as bytes (copied with a NUL into a stack buffer).
fn open(path: &[u8], flags: usize) -> isize {
    let mut buf = [0u8; 4096];
    if path.len() >= buf.len() {
        return -36; // ENAMETOOLONG
    }
    buf[..path.len()].copy_from_slice(path);
    syscall(nr::OPENAT, [AT_FDCWD as usize, buf.as_ptr() as usize, flags | O_CLOEXEC, 0, 0])
}

fn write_all(fd: usize, mut data: &[u8]) -> isize {
    while !data.is_empty() {
        let n = syscall(nr::WRITE, [fd, data.as_ptr() as usize, data.len(), 0, 0]);
        if n <= 0 {
            return n;
        }
        data = &data[n as usize..];
    }
    0
}

fn exit(code: usize) -> ! {
    syscall(nr::EXIT_GROUP, [code, 0, 0, 0, 0]);
    loop {}
}

/// Writes `value` in decimal into `out`; returns the digits.
fn decimal(mut value: usize, out: &mut [u8; 20]) -> &[u8] {
    let mut i = out.len();
    loop {
        i -= 1;
        out[i] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &out[i..];
        }
    }
}

/// Reports `F<step>:<index>:<errno>` and exits.
fn fail(step: u8, index: usize, ret: isize) -> ! {
    let mut line = [0u8; 64];
    let mut len = 0;
    let mut push = |bytes: &[u8]| {
        line[len..len + bytes.len()].copy_from_slice(bytes);
        len += bytes.len();
    };
    let (mut a, mut b) = ([0u8; 20], [0u8; 20]);
    push(&[b'F', step, b':']);
    push(decimal(index, &mut a));
    push(b":");
    push(decimal((-ret) as usize, &mut b));
    push(b"\n");
    write_all(1, &line[..len]);
    exit(1)
}

fn check(step: u8, index: usize, ret: isize) -> isize {
    if ret < 0 {
        fail(step, index, ret);
    }
    ret
}

/// Joins and creates the pod's namespaces, sets hostname and sysctls.
fn enter_pod(spec: &protocol::Spec<'_>) {
    // Like the pause container: the last process the OOM killer should pick. Root without
    // CAP_SYS_RESOURCE cannot lower it; the pod does not depend on it.
    let fd = open(b"/proc/self/oom_score_adj", O_WRONLY);
    if fd >= 0 {
        write_all(fd as usize, b"-998");
        syscall(nr::CLOSE, [fd as usize, 0, 0, 0, 0]);
    }
    if let Some(netns) = spec.netns {
        let fd = check(protocol::STEP_OPEN_NETNS, 0, open(netns, O_RDONLY)) as usize;
        if spec.join_netns_owner {
            // The user namespace first: the netns, and what is created below, are owned by it.
            let user = check(protocol::STEP_NETNS_OWNER, 0, syscall(nr::IOCTL, [fd, NS_GET_USERNS, 0, 0, 0]));
            check(protocol::STEP_JOIN_USERNS, 0, syscall(nr::SETNS, [user as usize, CLONE_NEWUSER, 0, 0, 0]));
            syscall(nr::CLOSE, [user as usize, 0, 0, 0, 0]);
        }
        check(protocol::STEP_JOIN_NETNS, 0, syscall(nr::SETNS, [fd, CLONE_NEWNET, 0, 0, 0]));
        syscall(nr::CLOSE, [fd, 0, 0, 0, 0]);
    }
    let mut flags = 0;
    if spec.new_ipc {
        flags |= CLONE_NEWIPC;
    }
    if spec.new_uts {
        flags |= CLONE_NEWUTS;
    }
    if spec.new_pid {
        flags |= CLONE_NEWPID;
    }
    if flags != 0 {
        check(protocol::STEP_UNSHARE, 0, syscall(nr::UNSHARE, [flags, 0, 0, 0, 0]));
    }
    if let (true, Some(name)) = (spec.new_uts, spec.hostname) {
        check(
            protocol::STEP_HOSTNAME,
            0,
            syscall(nr::SETHOSTNAME, [name.as_ptr() as usize, name.len(), 0, 0, 0]),
        );
    }
    // /proc/sys/net and the IPC keys resolve against the writer's namespaces: ours now.
    for (i, (path, value)) in protocol::sysctls(spec.raw).enumerate() {
        let fd = check(protocol::STEP_SYSCTL, i, open(path, O_WRONLY)) as usize;
        check(protocol::STEP_SYSCTL, i, write_all(fd, value));
        syscall(nr::CLOSE, [fd, 0, 0, 0, 0]);
    }
}

/// Closes every fd but stdio: whatever the parent forgot to mark close-on-exec (a listening
/// socket, a pipe) must not live on in the pod for as long as the pod does.
fn close_inherited_fds() {
    if syscall(nr::CLOSE_RANGE, [3, u32::MAX as usize, 0, 0, 0]) < 0 {
        // Before Linux 5.9: one by one, up to a limit no spawn of corral's reaches.
        for fd in 3..1024 {
            syscall(nr::CLOSE, [fd, 0, 0, 0, 0]);
        }
    }
}

/// Takes away everything the holder does not need to hold namespaces and reap children, so that
/// a container that can see it (pid 1 of a shared PID namespace) sees nothing of the node and
/// can use nothing of its privileges. The pause container gets the same from runc.
fn confine() {
    // comm is otherwise the memfd's fd number the holder was executed from.
    syscall(nr::PRCTL, [PR_SET_NAME, b"corral-holder\0".as_ptr() as usize, 0, 0, 0]);
    confine_mounts();
    // The bounding and ambient sets first (dropping needs CAP_SETPCAP), then the rest.
    for cap in 0..64 {
        syscall(nr::PRCTL, [PR_CAPBSET_DROP, cap, 0, 0, 0]); // EINVAL past the last cap
    }
    check(protocol::STEP_CONFINE, 1, syscall(nr::PRCTL, [PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0]));
    let header: [u32; 2] = [0x2008_0522, 0]; // _LINUX_CAPABILITY_VERSION_3, this thread
    let data = [0u32; 6]; // effective, permitted, inheritable, twice (64 bits)
    check(
        protocol::STEP_CONFINE,
        2,
        syscall(nr::CAPSET, [header.as_ptr() as usize, data.as_ptr() as usize, 0, 0, 0]),
    );
    check(protocol::STEP_CONFINE, 3, syscall(nr::PRCTL, [PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0]));
    // Not dumpable: /proc/<pid>/{root,cwd,fd,environ,mem} need CAP_SYS_PTRACE on the node, which
    // containerd and corral have and a container does not.
    check(protocol::STEP_CONFINE, 4, syscall(nr::PRCTL, [PR_SET_DUMPABLE, 0, 0, 0, 0]));
    install_seccomp();
}

/// A mount namespace of the holder's own whose only mount is an empty read-only tmpfs as `/`:
/// /proc/<holder>/root and /proc/<holder>/mountinfo then show nothing of the node.
fn confine_mounts() {
    let step = protocol::STEP_CONFINE;
    check(step, 5, syscall(nr::UNSHARE, [CLONE_NEWNS, 0, 0, 0, 0]));
    // Nothing done below may propagate back to the node's mounts.
    check(step, 6, syscall(nr::MOUNT, [0, b"/\0".as_ptr() as usize, 0, MS_REC | MS_PRIVATE, 0]));
    // /proc exists on every node corral runs on (it reads /proc/<pid>/ns); the tmpfs covers it
    // in this namespace only and becomes the root.
    let flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
    let (fs, dir, data) = (b"tmpfs\0", b"/proc\0", b"size=4k,nr_inodes=1,mode=0555\0");
    check(
        step,
        7,
        syscall(nr::MOUNT, [fs.as_ptr() as usize, dir.as_ptr() as usize, fs.as_ptr() as usize, flags, data.as_ptr() as usize]),
    );
    check(step, 8, syscall(nr::CHDIR, [dir.as_ptr() as usize, 0, 0, 0, 0]));
    // pivot_root(".", ".") stacks the old root on the new one; detaching it leaves the tmpfs.
    let dot = b".\0".as_ptr() as usize;
    check(step, 9, syscall(nr::PIVOT_ROOT, [dot, dot, 0, 0, 0]));
    check(step, 10, syscall(nr::UMOUNT2, [dot, MNT_DETACH, 0, 0, 0]));
    check(step, 11, syscall(nr::CHDIR, [b"/\0".as_ptr() as usize, 0, 0, 0, 0]));
}

/// One classic-BPF instruction, `struct sock_filter`: code, jump if true, jump if false, k.
#[derive(Clone, Copy)]
#[repr(C)]
struct Insn(u16, u8, u8, u32);

/// `struct sock_fprog`.
#[repr(C)]
struct Fprog {
    len: u16,
    filter: *const Insn,
}

/// Allows the few system calls the holder makes from here on (report, fork pid 1, point stdio
/// at /dev/null, wait for signals and children, exit); any other fails with EPERM, x32 calls
/// included (same arch value, other numbers). Another architecture's entry (i386) kills it.
fn install_seccomp() {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const ALLOW: u32 = 0x7fff_0000;
    const KILL_PROCESS: u32 = 0x8000_0000;
    const ERRNO_EPERM: u32 = 0x0005_0001;
    const SECCOMP_SET_MODE_FILTER: usize = 1;
    let allowed = [
        nr::WRITE,
        nr::CLOSE,
        nr::DUP3,
        nr::CLONE,
        nr::GETPID,
        nr::WAIT4,
        nr::RT_SIGTIMEDWAIT,
        nr::RT_SIGRETURN,
        nr::RESTART_SYSCALL,
        nr::EXIT,
        nr::EXIT_GROUP,
    ];
    let mut filter = [Insn(0, 0, 0, 0); 32];
    let mut n = 0;
    let mut push = |insn: Insn| {
        filter[n] = insn;
        n += 1;
    };
    push(Insn(LD_W_ABS, 0, 0, 4)); // seccomp_data.arch
    push(Insn(JEQ_K, 1, 0, nr::AUDIT_ARCH));
    push(Insn(RET_K, 0, 0, KILL_PROCESS));
    push(Insn(LD_W_ABS, 0, 0, 0)); // seccomp_data.nr
    for (i, call) in allowed.iter().enumerate() {
        // Equal: jump over the remaining tests and the EPERM to the ALLOW at the end.
        push(Insn(JEQ_K, (allowed.len() - i) as u8, 0, *call as u32));
    }
    push(Insn(RET_K, 0, 0, ERRNO_EPERM));
    push(Insn(RET_K, 0, 0, ALLOW));
    let prog = Fprog { len: n as u16, filter: filter.as_ptr() };
    check(
        protocol::STEP_CONFINE,
        12,
        syscall(nr::SECCOMP, [SECCOMP_SET_MODE_FILTER, 0, &prog as *const Fprog as usize, 0, 0]),
    );
}

/// Points stdio at `null` (opened before the root went away) so the parent's pipes see EOF and
/// nothing of the node is held open.
fn detach_stdio(null: isize) {
    if null >= 0 {
        for fd in 0..3 {
            syscall(nr::DUP3, [null as usize, fd, 0, 0, 0]);
        }
        syscall(nr::CLOSE, [null as usize, 0, 0, 0, 0]);
    }
}

fn report_ready(pid: isize) {
    let mut digits = [0u8; 20];
    let mut line = [0u8; 24];
    let d = decimal(pid as usize, &mut digits);
    line[0] = b'R';
    line[1..1 + d.len()].copy_from_slice(d);
    line[1 + d.len()] = b'\n';
    write_all(1, &line[..d.len() + 2]);
}

/// Waits for signals forever: reaps children on SIGCHLD (as pid 1 of the pod it inherits
/// orphans), exits on SIGTERM/SIGINT, as the pause container does. Waited-for signals are
/// delivered even to pid 1 of a PID namespace, so in a shared-PID pod a container allowed to
/// signal it can end the pod with those two, as it can pause; every other signal keeps its
/// default action, which the kernel does not apply to pid 1 for signals sent from inside.
fn wait_forever() -> ! {
    let set = WAITED;
    loop {
        let sig = syscall(nr::RT_SIGTIMEDWAIT, [&set as *const u64 as usize, 0, 0, 8, 0]);
        match sig {
            17 => while syscall(nr::WAIT4, [usize::MAX, 0, WNOHANG, 0, 0]) > 0 {},
            2 | 15 => exit(0),
            _ => {}
        }
    }
}

#[no_mangle]
extern "C" fn holder_main() -> ! {
    close_inherited_fds();
    let mut buf = [0u8; 32 * 1024];
    let mut len = 0;
    loop {
        let n = syscall(nr::READ, [0, buf[len..].as_mut_ptr() as usize, buf.len() - len, 0, 0]);
        if n == 0 {
            break;
        }
        check(protocol::STEP_READ_SPEC, 0, n);
        len += n as usize;
        if len == buf.len() {
            fail(protocol::STEP_READ_SPEC, 0, -7); // E2BIG
        }
    }
    let Some(spec) = protocol::parse(&buf[..len]) else {
        fail(protocol::STEP_PARSE_SPEC, 0, -22); // EINVAL
    };
    // Block the signals we wait for before anything can send them.
    let set = WAITED;
    check(protocol::STEP_SIGNALS, 0, syscall(nr::RT_SIGPROCMASK, [0, &set as *const u64 as usize, 0, 8, 0]));
    enter_pod(&spec);
    // Opened now: after `confine` there is no /dev to open it from.
    let null = open(b"/dev/null", O_RDWR);
    confine();
    if spec.new_pid {
        let child = check(protocol::STEP_FORK, 0, syscall(nr::CLONE, [SIGCHLD, 0, 0, 0, 0]));
        if child > 0 {
            report_ready(child);
            exit(0);
        }
        detach_stdio(null);
        wait_forever();
    }
    report_ready(syscall(nr::GETPID, [0; 5]));
    detach_stdio(null);
    wait_forever()
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    exit(101)
}

/// `core` is precompiled with unwinding and names this symbol; with panic=abort it is never
/// called.
#[no_mangle]
extern "C" fn rust_eh_personality() {}

// The memory routines the compiler emits calls to; there is no libc to provide them. Volatile
// byte accesses keep the optimizer from turning these loops back into calls to themselves.

/// # Safety
/// `dest` and `src` are valid for `n` bytes and do not overlap.
#[no_mangle]
unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: the caller guarantees both ranges are valid for `n` bytes.
        unsafe { core::ptr::write_volatile(dest.add(i), core::ptr::read_volatile(src.add(i))) };
    }
    dest
}

/// # Safety
/// `dest` and `src` are valid for `n` bytes; they may overlap.
#[no_mangle]
unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize) < (src as usize) {
        // SAFETY: as for memcpy; copying forwards is correct when dest precedes src.
        return unsafe { memcpy(dest, src, n) };
    }
    for i in (0..n).rev() {
        // SAFETY: the caller guarantees both ranges are valid for `n` bytes.
        unsafe { core::ptr::write_volatile(dest.add(i), core::ptr::read_volatile(src.add(i))) };
    }
    dest
}

/// # Safety
/// `dest` is valid for `n` bytes.
#[no_mangle]
unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: the caller guarantees the range is valid for `n` bytes.
        unsafe { core::ptr::write_volatile(dest.add(i), c as u8) };
    }
    dest
}

/// # Safety
/// `a` and `b` are valid for `n` bytes.
#[no_mangle]
unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: the caller guarantees both ranges are valid for `n` bytes.
        let (x, y) = unsafe { (core::ptr::read_volatile(a.add(i)), core::ptr::read_volatile(b.add(i))) };
        if x != y {
            return x as i32 - y as i32;
        }
    }
    0
}

/// # Safety
/// As for memcmp.
#[no_mangle]
unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as memcmp.
    unsafe { memcmp(a, b, n) }
}
