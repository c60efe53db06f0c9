complete -c cxl-accel -l socket-path -d 'Unix socket QEMU connects to (its vhost-user chardev path). A stale socket left by a crashed daemon is replaced; a socket a live daemon is serving, or anything that is not a socket, is an error. Not needed with --fd' -r -F
complete -c cxl-accel -l fd -d 'A listening unix socket handed over by the caller (as libvirt does), used instead of --socket-path (vhost-user backend program conventions)' -r
complete -c cxl-accel -l socket-mode -d '"server": the daemon listens on --socket-path and QEMU connects. "client": QEMU listens (its chardev has server=on) and the daemon connects, reconnecting whenever the connection drops; a restarted daemon finds QEMU again this way' -r
complete -c cxl-accel -l memory-path -d 'Device memory file, shared with QEMU (memory-backend-file mem-path). Created and sized when missing; an existing file must have exactly --memory-size bytes. tmpfs (/dev/shm) or hugetlbfs paths work' -r -F
complete -c cxl-accel -l memory-size -d 'Device memory size, a multiple of 2 MiB: bytes or with a K, M, G suffix (256M, 4G)' -r
complete -c cxl-accel -l virtio-id -d 'Virtio device ID for QEMU\'s vhost-user-test-device-pci. The default (21) is assigned by the virtio spec but implemented by neither Linux nor QEMU, so only our driver binds it' -r
complete -c cxl-accel -l queue-size -d 'Maximum size of each virtqueue (power of two, 1..32768)' -r
complete -c cxl-accel -l dma-threads -d 'Number of DMA engines, each a thread executing commands concurrently' -r
complete -c cxl-accel -l index -d 'Instance number of this device; names QEMU objects and picks PCI slot 0x10+N' -r
complete -c cxl-accel -l peer-memory-path -d 'Memory file of a peer device (repeatable). Its BAR, seen in the memory table, counts as peer-to-peer memory in the device statistics' -r -F
complete -c cxl-accel -l attach -d 'How the guest sees device memory: "bar" (BAR2 of an ivshmem-plain function, managed by the driver as coherent device pages) or "numa" (a CPU-less NUMA node of guest RAM)' -r
complete -c cxl-accel -l seccomp -d 'seccomp sandbox once serving: "enforce" (default: an unlisted system call kills the daemon with a message naming it), "log" (unlisted calls are logged by the kernel\'s audit) or "off". Opening files, exec, ptrace, other sockets than unix ones and executable memory are never allowed; under --supervise the thread that relays the front-end\'s messages has a shorter list of its own' -r
complete -c cxl-accel -l socket-group -d 'Group (name or number) whose members may connect to the socket and open the memory file besides the daemon\'s user: both get mode 0660 and this group. For a QEMU that runs as another user (as under libvirt). Without it, both are 0600' -r
complete -c cxl-accel -l state-path -d 'Crash-safe device state (allocations, exports, counters, command journal). Default: the memory file\'s path plus ".state". Locked while a daemon runs' -r -F
complete -c cxl-accel -l worker-fd -d 'Internal (--supervise): serve the one connection queued on this inherited listener' -r
complete -c cxl-accel -l guest-ram -d 'With --print-qemu-args: size of the shared guest RAM backend to print (vhost-user needs shared guest RAM), or "none" when another device\'s arguments already carry it' -r
complete -c cxl-accel -l reconnect-ms -d 'With --print-qemu-args: add reconnect-ms=MS to the chardev so QEMU reconnects after a daemon restart. 0 (default) leaves it out: QEMU 10.2\'s test device does not wait for a background connection at start-up and fails with "Failed to set msg fds"' -r
complete -c cxl-accel -l supervise -d 'Run the device in a worker process and restart it if it dies (crash, SIGKILL, OOM): this process keeps QEMU\'s connection, replays the set-up to the new worker, which continues from the state file. Commands in flight at the crash complete or fail with INTERRUPTED (-EIO in the guest). SIGTERM stops both'
complete -c cxl-accel -l resume -d 'Internal (--supervise): the connection outlived a previous worker; continue it'
complete -c cxl-accel -l print-qemu-args -d 'Print the QEMU arguments that attach this device, then exit'
complete -c cxl-accel -l print-capabilities -d 'Print the backend\'s capabilities as JSON (vhost-user backend program conventions) and exit; every other argument is ignored'
complete -c cxl-accel -s h -l help -d 'Print help (see more with \'--help\')'
complete -c cxl-accel -s V -l version -d 'Print version'
