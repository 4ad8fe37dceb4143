// test/consumer/cmake: linked with grad::device (the device library and what its backends link);
// prints what scripts/config-matrix.sh's pkg-config program for grad-device prints.
#include <grad/device/device.hpp>
#include <cstdio>

int main() { std::printf("cuda_available: %d\n", grad::device::cuda_available() ? 1 : 0); }
