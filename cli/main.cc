// barge's entry point: the only place that catches exceptions.
#include <exception>
#include <iostream>

#include "cli/commands.h"

int main(int argc, char** argv) {
  try {
    return barge::cli::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "barge: internal error: " << e.what() << "\n";
    return 70;
  }
}
