/* Fault injection counters (util/fault.h). */
#include "util/fault.h"

/* per kind: calls left until the failing one; 0 = disarmed */
static long countdown[MT_FAULT_KINDS];

void mt_fault_arm(mt_fault_kind k, long n) { __atomic_store_n(&countdown[k], n, __ATOMIC_SEQ_CST); }

int mt_fault_hit(mt_fault_kind k) {
    if (__atomic_load_n(&countdown[k], __ATOMIC_RELAXED) == 0) return 0;
    long left = __atomic_sub_fetch(&countdown[k], 1, __ATOMIC_SEQ_CST);
    return left == 0;
}

long mt_fault_pending(mt_fault_kind k) { return __atomic_load_n(&countdown[k], __ATOMIC_SEQ_CST); }
