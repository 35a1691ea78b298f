// The main of a multi-process doctest program: every process started by cjax_launch joins the run
// (distributed::initialize from the launcher's environment), runs the same cases in the same
// order, and leaves through distributed::shutdown.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "cjax/cjax.h"
#include "cjax/distributed.h"

int main(int argc, char** argv) {
  cjax::distributed::initialize();
  doctest::Context context(argc, argv);
  int rc = context.run();
  cjax::distributed::shutdown();
  return rc;
}
