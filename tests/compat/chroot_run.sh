#!/bin/sh
# The baseline of the compatibility suite: CPython's regression tests in a
# plain chroot of the same tree the image was built from, set up as chroot
# users do (/proc, the usual /dev nodes, a tmpfs /tmp, an /etc/hosts naming
# localhost), on an overlay so the tree itself is not written to, in a
# mount and network namespace of its own (loopback only, as a sandbox has:
# network tests are left out either way).
#
#   chroot_run.sh TREE SCRATCH OUT.xml TEST...
# Run it under `unshare --mount --net --uts --ipc --fork`: everything it
# mounts goes with those namespaces, and a test that sets the hostname
# (test_sethostname) sets that of its own UTS namespace, not the host's.
set -eu
tree=$1 scratch=$2 out=$3
shift 3
ip link set lo up
mount --make-rprivate /
mkdir -p "$scratch/u" "$scratch/w" "$scratch/m"
mount -t overlay overlay -o "lowerdir=$tree,upperdir=$scratch/u,workdir=$scratch/w,xino=on" "$scratch/m"
mount -t proc proc "$scratch/m/proc"
# The usual device nodes, as a container's /dev has them (and as Docker's
# has): the host's whole /dev would add /dev/vsock, whose tests hang on a
# host without vsock.
mount -t tmpfs -o mode=0755 dev "$scratch/m/dev"
for n in null zero full random urandom tty; do
  touch "$scratch/m/dev/$n"
  mount --bind "/dev/$n" "$scratch/m/dev/$n"
done
mkdir -p "$scratch/m/dev/pts" "$scratch/m/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$scratch/m/dev/pts"
ln -s pts/ptmx "$scratch/m/dev/ptmx"
mount -t tmpfs -o mode=1777 shm "$scratch/m/dev/shm"
for l in fd:/proc/self/fd stdin:/proc/self/fd/0 stdout:/proc/self/fd/1 stderr:/proc/self/fd/2; do
  ln -s "${l#*:}" "$scratch/m/dev/${l%%:*}"
done
mount -t tmpfs tmpfs "$scratch/m/tmp"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n' "$(hostname)" > "$scratch/m/etc/hosts"
mkdir -p "$scratch/m/work"
chroot "$scratch/m" /bin/sh -c "cd /work && HOME=/root python3 -m test -j1 --timeout 600 --junit-xml /work/result.xml $*" \
  > "$scratch/output.txt" 2>&1 || true
cp "$scratch/m/work/result.xml" "$out"
