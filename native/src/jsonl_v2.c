/* jsonl.c built again for x86-64-v2 CPUs (popcnt, SSSE3, SSE4.1: every x86-64 CPU since about
 * 2009), as `jsonl_scan_v2`: module.c calls it where the CPU has them. It reads short
 * numbers 16 bytes at a time.
 * The target is set before any header, so that the helpers in scan.h (short_number) are built
 * for it too. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) /* SCAN_V2_BUILD */
#pragma GCC target("popcnt,sse3,ssse3,sse4.1")
#define jsonl_scan jsonl_scan_v2
#include "jsonl.c"
#endif
