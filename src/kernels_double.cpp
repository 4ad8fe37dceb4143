// The compiled kernel library's double half: every hot loop that
// grad/kernels_extern.hpp lists, instantiated once with the project's flags
// (-O3, -ffp-contract=off; one copy per instruction set inside each).
#include <grad/grad.hpp>

GRAD_KERNEL_INSTANCES(, double)
