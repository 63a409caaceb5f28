#define GPUARR_IMPLEMENTATION
#include "gpuarr.h" /* build from the repository root: -I. */
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  long iters = argc>1?atol(argv[1]):20000000;
  gpuarr_init(NULL);
  size_t shape[1]={1024}; gpuarr_array a;
  for(int r=0;r<5;r++){
  double t0=now();
  for(long i=0;i<iters;i++){ if(gpuarr_empty(gpuarr_host(),GPUARR_F32,1,shape,&a)) return 1; gpuarr_release(a);}
  double t1=now();
  for(long i=0;i<iters;i++){ void*p=malloc(4096); __asm__ volatile(""::"r"(p):"memory"); free(p);}
  double t2=now();
  printf("pair %.1f ns malloc %.1f ns ratio %.2f\n",(t1-t0)/iters*1e9,(t2-t1)/iters*1e9,(t1-t0)/(t2-t1));}
  gpuarr_shutdown(); return 0;}
