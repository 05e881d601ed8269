// Raw system calls that never touch errno or any other thread-local state.
// A runner shares the spawner's address space (CLONE_VM), TLS included, so it
// must not write errno, call malloc, or use anything in libc that does.
#pragma once

#include <sys/syscall.h>

namespace dsec::fncall::raw {

// Returns the kernel's result: >= 0 on success, -errno on failure.
inline long Syscall(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
#if defined(__x86_64__)
  long ret;
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
#elif defined(__aarch64__)
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  register long x4 __asm__("x4") = e;
  register long x5 __asm__("x5") = f;
  __asm__ volatile("svc 0"
                   : "+r"(x0)
                   : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                   : "memory");
  return x0;
#else
#error "dsec-spawner: add the raw syscall sequence for this architecture"
#endif
}

template <class A = long, class B = long, class C = long, class D = long, class E = long>
inline long Call(long n, A a = 0, B b = 0, C c = 0, D d = 0, E e = 0) {
  return Syscall(n, (long)a, (long)b, (long)c, (long)d, (long)e);
}

[[noreturn]] inline void Exit(int code) {
  for (;;) Syscall(SYS_exit, code);
}

inline long Write(int fd, const void* buf, unsigned long n) { return Call(SYS_write, fd, buf, n); }

inline unsigned long Strlen(const char* s) {
  unsigned long n = 0;
  while (s[n]) ++n;
  return n;
}

}  // namespace dsec::fncall::raw
