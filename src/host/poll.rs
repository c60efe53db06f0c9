// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Waiting until descriptors have something to read: poll(2) in one place, with a
//! signal's EINTR waiting on for the time left rather than ending the wait.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

/// Waits until one of `fds` is readable or hung up, for at most `timeout` (`None`: for
/// ever). Returns which ones are; all `false` when the time ran out.
pub fn wait_readable<const N: usize>(
    fds: [BorrowedFd<'_>; N],
    timeout: Option<Duration>,
) -> io::Result<[bool; N]> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                // rounded up: a wait of less than 1 ms must not become a busy loop
                let left = d.saturating_duration_since(Instant::now());
                left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            }
        };
        // SAFETY: poll reads and writes the N pollfd entries of `pfds`, a live array whose
        // length it is given; the descriptors are borrowed for the call. Nothing is kept.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(pfds.map(|p| p.revents != 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn reports_which_descriptor_is_readable() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let (c, _d) = UnixStream::pair().unwrap();
        b.write_all(b"x").unwrap();
        let r = wait_readable([c.as_fd(), a.as_fd()], Some(Duration::from_secs(5))).unwrap();
        assert_eq!(r, [false, true]);
    }

    #[test]
    fn a_hang_up_is_readable() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        assert_eq!(wait_readable([a.as_fd()], None).unwrap(), [true]);
    }

    #[test]
    fn times_out_with_nothing_readable_after_the_whole_timeout() {
        let (a, _b) = UnixStream::pair().unwrap();
        let t0 = Instant::now();
        let r = wait_readable([a.as_fd()], Some(Duration::from_micros(30_500))).unwrap();
        assert_eq!(r, [false]);
        assert!(t0.elapsed() >= Duration::from_micros(30_500));
    }

    #[test]
    fn a_zero_timeout_only_looks() {
        let (a, mut b) = UnixStream::pair().unwrap();
        assert_eq!(
            wait_readable([a.as_fd()], Some(Duration::ZERO)).unwrap(),
            [false]
        );
        b.write_all(b"x").unwrap();
        assert_eq!(
            wait_readable([a.as_fd()], Some(Duration::ZERO)).unwrap(),
            [true]
        );
    }
}
