/* csv.c built again for x86-64-v3 CPUs (of their instructions, AVX2 and BMI1/2 on top of v2's), as
 * `csv_scan_v3`: it finds a word's commas and breaks 32 bytes at a time and a needed comma with
 * one pdep instead of a step per comma before it. module.c calls it where the CPU has these and
 * runs pdep in hardware: Intel, and AMD from family 19h (Zen 3). Zen 1 and 2 run pdep in
 * microcode, up to hundreds of cycles, so they keep the v2 build.
 * The target is set before any header, as in csv_v2.c. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) /* SCAN_V2_BUILD */
#pragma GCC target("popcnt,sse3,ssse3,sse4.1,avx,avx2,bmi,bmi2")
#define csv_scan csv_scan_v3
#include "csv.c"
#endif
