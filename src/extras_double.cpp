// The compiled library's double layer above the tape: modules, the batch
// iterator, the CSV readers and model files (the GRAD_*_INSTANCES lists at
// the end of each header), compiled once here so that a consumer's unit
// built with GRAD_COMPILED_KERNELS calls them instead of compiling them.
// A unit of its own: a program that uses none of them links none of it.
#include <grad/csv.hpp>
#include <grad/data.hpp>
#include <grad/model_file.hpp>
#include <grad/modules.hpp>

GRAD_MODULES_INSTANCES(, double)
GRAD_DATA_INSTANCES(, double)
GRAD_CSV_INSTANCES(, double)
GRAD_MODEL_FILE_INSTANCES(, double)
