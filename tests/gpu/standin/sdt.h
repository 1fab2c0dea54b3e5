// A minimal SystemTap SDT probe (the format of <sys/sdt.h>, which this machine lacks): a nop at
// the probe site and a .note.stapsdt entry naming provider, probe, the semaphore and where each
// argument lives ("8@%rdi" style operands). Tools (BCC, bpftrace, the agent) read these notes;
// the semaphore counts attached tracers, so a program can skip preparing arguments nobody reads.
#pragma once

#define _SDT_NOTE(provider, name, sem, argfmt, ...)                                              \
    __asm__ __volatile__(                                                                        \
        "990: nop\n"                                                                             \
        ".pushsection .note.stapsdt,\"?\",\"note\"\n"                                            \
        ".balign 4\n"                                                                            \
        ".4byte 992f-991f, 994f-993f, 3\n"                                                       \
        "991: .asciz \"stapsdt\"\n"                                                              \
        "992: .balign 4\n"                                                                       \
        "993: .8byte 990b\n"                                                                     \
        ".8byte _.stapsdt.base\n"                                                                \
        ".8byte " #sem "\n"                                                                      \
        ".asciz \"" #provider "\"\n"                                                             \
        ".asciz \"" #name "\"\n"                                                                 \
        ".asciz \"" argfmt "\"\n"                                                                \
        "994: .balign 4\n"                                                                       \
        ".popsection\n"                                                                          \
        ".ifndef _.stapsdt.base\n"                                                               \
        ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"                  \
        ".weak _.stapsdt.base\n"                                                                 \
        ".hidden _.stapsdt.base\n"                                                               \
        "_.stapsdt.base: .space 1\n"                                                             \
        ".size _.stapsdt.base, 1\n"                                                              \
        ".popsection\n"                                                                          \
        ".endif\n"                                                                               \
        :: __VA_ARGS__)

#define SDT_SEMAPHORE(provider, name) \
    __extension__ unsigned short provider##_##name##_semaphore __attribute__((unused)) \
        __attribute__((section(".probes")));
#define SDT_ENABLED(provider, name) __builtin_expect(provider##_##name##_semaphore, 0)

#define SDT_PROBE1(provider, name, a1) \
    _SDT_NOTE(provider, name, provider##_##name##_semaphore, "8@%0", "nor"((long)(a1)))
#define SDT_PROBE4(provider, name, a1, a2, a3, a4)                                     \
    _SDT_NOTE(provider, name, provider##_##name##_semaphore, "8@%0 -4@%1 8@%2 8@%3", \
              "nor"((long)(a1)), "nor"((int)(a2)), "nor"((long)(a3)), "nor"((long)(a4)))
