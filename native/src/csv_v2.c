/* csv.c built again for x86-64-v2 CPUs (popcnt, SSSE3, SSE4.1: every x86-64 CPU since about
 * 2009), as `csv_scan_v2`: module.c calls it where the CPU has them. It counts a record's
 * commas with the popcnt instruction (a libgcc call otherwise) and reads short numbers 16 bytes
 * at a time.
 * The target is set before any header, so that the helpers in scan.h (short_number) are built
 * for it too. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) /* SCAN_V2_BUILD */
#pragma GCC target("popcnt,sse3,ssse3,sse4.1")
#define csv_scan csv_scan_v2
#include "csv.c"
#endif
