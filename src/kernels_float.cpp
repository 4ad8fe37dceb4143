// The compiled kernel library's float half: every hot loop that
// grad/kernels_extern.hpp lists and the reverse walk (core.hpp),
// instantiated once with the project's flags (meson.build, -ffp-contract=off; one
// copy per instruction set inside each loop).
#include <grad/core.hpp>

GRAD_KERNEL_INSTANCES(, float)
GRAD_WALK_INSTANCES(, float)
