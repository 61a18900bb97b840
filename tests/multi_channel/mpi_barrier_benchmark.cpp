// Open MPI's MPI_Barrier timed as barrier_benchmark times MultiChannel::barrier, for the same N in
// the same run (scripts/barrier.sh starts it under mpirun). Rank 0 prints one line:
//   mpi_barrier ranks=N us_per_barrier=X
//
//   mpirun -np N mpi_barrier_benchmark [iterations]     (default 1000)
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int iterations = argc > 1 ? std::atoi(argv[1]) : 1000;
    // As barrier_benchmark: a tenth of the iterations (at least 10) first, untimed.
    const int warmup = iterations / 10 > 10 ? iterations / 10 : 10;
    for (int i = 0; i < warmup; ++i) MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int i = 0; i < iterations; ++i) MPI_Barrier(MPI_COMM_WORLD);
    const double seconds = MPI_Wtime() - start;
    // The slowest rank's time: a barrier has ended when every rank has left it.
    double slowest = 0;
    MPI_Reduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) std::printf("mpi_barrier ranks=%d us_per_barrier=%.1f\n", size, slowest * 1e6 / iterations);
    MPI_Finalize();
    return 0;
}
