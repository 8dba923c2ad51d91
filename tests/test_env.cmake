# Read by ctest (tests/CMakeLists.txt, TEST_INCLUDE_FILES): the environment
# every test inherits. A value the caller set is kept.
#
# Most of an MPI test's CPU is starting its ranks, not refitting (MPI_Init and
# finalize of 8 ranks alone: 1.3 s of CPU; librefit's own code: 3 % of the
# samples in a profile of an 8-rank refit job).
#
# Open MPI's `ob1` point-to-point layer: the one a plain host selects anyway,
# named so that MPI_Init does not open the `cm` layer and its network
# libraries in every rank.
if(NOT DEFINED ENV{OMPI_MCA_pml})
  set(ENV{OMPI_MCA_pml} ob1)
endif()
# hwloc's I/O discovery, which Open MPI runs in every rank: it reads each PCI
# device's config space (a trap per read in a VM; 10 % of an 8-rank job's
# start-up CPU in a profile on the CI machine) to place NICs and GPUs. No
# test places either (the GPU tests bind by node-local rank, as refit does),
# so the tests keep hwloc's CPU and memory topology and leave out the I/O
# components. Production jobs (refit-launch outside ctest) are untouched.
if(NOT DEFINED ENV{HWLOC_COMPONENTS})
  set(ENV{HWLOC_COMPONENTS} "-linuxio,-pci,-opencl,-gl")
endif()
