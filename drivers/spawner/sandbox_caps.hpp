// The capabilities a guarded sandbox's programs keep (a container's always;
// a VM guest's when its task is guarded: dsec-agent --guarded): what file
// ownership, permissions and setuid programs need, nothing that remounts,
// unmounts, loads modules, opens devices raw, reads files by handle,
// traces or sets the clock. A header of its own: the static spawner and
// the static agent both use it.
#pragma once

namespace dsec::container {

inline constexpr unsigned long long kContainerCaps =
    (1ull << 0) /*CHOWN*/ | (1ull << 1) /*DAC_OVERRIDE*/ | (1ull << 3) /*FOWNER*/ | (1ull << 4) /*FSETID*/ |
    (1ull << 5) /*KILL*/ | (1ull << 6) /*SETGID*/ | (1ull << 7) /*SETUID*/ | (1ull << 8) /*SETPCAP*/ |
    (1ull << 10) /*NET_BIND_SERVICE*/ | (1ull << 18) /*SYS_CHROOT*/ | (1ull << 29) /*AUDIT_WRITE*/ |
    (1ull << 31) /*SETFCAP*/;

}  // namespace dsec::container
