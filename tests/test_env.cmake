# Read by ctest (tests/CMakeLists.txt, TEST_INCLUDE_FILES): the environment
# every test inherits. A value the caller set is kept.
if(NOT DEFINED ENV{OMPI_MCA_pml})
  set(ENV{OMPI_MCA_pml} ob1)
endif()
